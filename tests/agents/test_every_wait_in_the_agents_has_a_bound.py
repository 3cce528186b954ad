"""Every blocking call in ``agents/`` has a bound: a timeout, a socket timeout, or a reason
written next to it in the allowlist (``tests/agents/unbounded_waits.py``)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import unbounded_waits  # noqa: E402


def test_every_wait_in_the_agents_has_a_bound_or_a_written_reason():
    found = unbounded_waits.find()
    missing = unbounded_waits.unexcused(found)
    assert not missing, "waits without a bound (add a timeout, or a reason to ALLOWED):\n" + (
        "\n".join(map(str, missing))
    )


def test_every_allowlisted_wait_still_exists_and_says_why():
    found = unbounded_waits.find()
    assert not unbounded_waits.stale(found), "ALLOWED entries that excuse nothing any more"
    assert all(len(reason) > 20 for reason in unbounded_waits.ALLOWED.values())


def test_a_queue_get_without_a_timeout_added_to_the_agents_fails_the_check(tmp_path):
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "new.py").write_text(
        "import queue\n\ndef take(q: queue.Queue):\n    return q.get()\n"
    )
    missing = unbounded_waits.unexcused(unbounded_waits.find(tmp_path))
    assert [(w.path, w.function, w.call) for w in missing] == [("agents/new.py", "take", "q.get")]


@pytest.mark.parametrize(
    "code",
    [
        "q.get()",
        "q.get(True)",
        "q.get(True, None)",
        "q.put(item)",
        "q.put(item, True)",
        "thread.join()",
        "thread.join(None)",
        "event.wait()",
        "condition.wait(None)",
        "lock.acquire()",
        "lock.acquire(True)",
        "future.result()",
        "sock.accept()",
        "sock.recv(4096)",
        "conn.recv_bytes()",
        "select.select([fd], [], [])",
        "poller.poll()",
        "os.waitpid(pid, 0)",
        "signal.pause()",
        "subprocess.run(['true'])",
        "process.communicate()",
    ],
)
def test_the_check_finds_each_kind_of_unbounded_wait(code):
    found = unbounded_waits.find_in_source(f"def f():\n    {code}\n", "agents/x.py")
    assert len(found) == 1, code


@pytest.mark.parametrize(
    "code",
    [
        "q.get(timeout=1.0)",
        "q.get(True, 0.5)",
        "q.get(block=False)",
        "q.get_nowait()",
        "mapping.get('key')",
        "q.put(item, timeout=1.0)",
        "q.put(item, False)",
        "', '.join(names)",
        "thread.join(2.0)",
        "event.wait(0.2)",
        "lock.acquire(blocking=False)",
        "lock.acquire(True, 1.0)",
        "future.result(timeout=3)",
        "select.select([fd], [], [], 0.2)",
        "poller.poll(200)",
        "os.waitpid(pid, os.WNOHANG)",
        "subprocess.run(['true'], timeout=5)",
        "sock.settimeout(0.2)\n    sock.accept()",
    ],
)
def test_the_check_leaves_a_bounded_call_alone(code):
    assert unbounded_waits.find_in_source(f"def f():\n    {code}\n", "agents/x.py") == [], code


def test_every_lock_has_a_reason_that_says_what_its_holders_do():
    assert all(len(reason) > 40 for reason in unbounded_waits.ALLOWED_LOCKS.values())


def test_a_with_lock_added_to_the_agents_fails_the_check(tmp_path):
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "new.py").write_text(
        "import threading\n\n"
        "class Cache:\n"
        "    def __init__(self):\n"
        "        self._guard = threading.Lock()\n\n"
        "    def put(self, key, value):\n"
        "        with self._guard:\n"
        "            self.data[key] = value\n"
    )
    missing = unbounded_waits.unexcused(unbounded_waits.find(tmp_path))
    assert [(w.path, w.function, w.lock) for w in missing] == [
        ("agents/new.py", "Cache.put", "Cache._guard")
    ]


LOCK_MODULE = """\
import multiprocessing
import os
import select
import threading
import time

FORK_GUARD = threading.Lock()


class Hub:
    def __init__(self, sock):
        self.sock = sock
        self._state = threading.Condition()
        self._items = threading.RLock()
        self._not_empty = threading.Condition(self._items)
        self.shared = multiprocessing.get_context("fork").Semaphore(2)

    def method(self, q, d, fd, counter, lock, pipeline, path):
        {code}
"""


def _held(code: str) -> str:
    return re.search(r"with ([^:]+):", code).group(1)


def _found_in_lock_module(code: str) -> list[tuple[str | None, str]]:
    source = LOCK_MODULE.format(code=code.replace("\n", "\n        "))
    return [(w.lock, w.call) for w in unbounded_waits.find_in_source(source, "agents/x.py")]


@pytest.mark.parametrize(
    ("code", "lock"),
    [
        ("with FORK_GUARD:\n    pass", "FORK_GUARD"),
        ("with self._state:\n    d[1] = 2", "Hub._state"),
        ("with self._items:\n    pass", "Hub._items"),
        ("with self.shared:\n    pass", "Hub.shared"),
        ("with counter.get_lock():\n    counter.value += 1", "Hub.method: counter.get_lock()"),
        ("with lock:\n    pass", "Hub.method: lock"),
        ("guard = threading.Lock()\nwith guard:\n    pass", "Hub.method: guard"),
    ],
)
def test_the_check_finds_a_with_lock(code, lock):
    assert _found_in_lock_module(code) == [(lock, f"with {_held(code)}")]


@pytest.mark.parametrize(
    ("code", "call"),
    [
        ("with self._state:\n    self.sock.sendall(b'x')", "self.sock.sendall"),
        ("with self._state:\n    q.put(1, timeout=1.0)", "q.put"),
        ("with self._state:\n    q.get(timeout=1.0)", "q.get"),
        ("with self._state:\n    time.sleep(0.1)", "time.sleep"),
        ("with self._state:\n    os.write(fd, b'x')", "os.write"),
        ("with self._items:\n    self._state.wait(0.1)", "self._state.wait"),
        ("with FORK_GUARD:\n    pipeline.join(1.0)", "pipeline.join"),
    ],
)
def test_the_check_finds_a_blocking_call_made_holding_a_lock(code, call):
    assert (None, f"with {_held(code)}: {call}") in _found_in_lock_module(code)


@pytest.mark.parametrize(
    "code",
    [
        "with self._state:\n    self._state.wait(0.1)",
        "with self._items:\n    self._not_empty.wait(0.1)",
        "with self._state:\n    self._state.wait_for(lambda: True, 0.1)",
        "with self._state:\n    x = d.get(1)",
        "with self._state:\n    x = ', '.join(d)",
        "with self._state:\n    q.put(1, False)",
        "with self._state:\n    ok = lock.acquire(False)",
        "with self._state:\n    select.select([fd], [], [], 0)",
    ],
)
def test_the_check_leaves_a_call_that_does_not_block_under_a_lock_alone(code):
    assert [call for lock, call in _found_in_lock_module(code) if lock is None] == [], code


@pytest.mark.parametrize(
    "code",
    [
        "with open(path) as f:\n    pass",
        "with pipeline:\n    pass",
        "with os.scandir(path):\n    pass",
    ],
)
def test_the_check_leaves_a_with_that_takes_no_lock_alone(code):
    assert _found_in_lock_module(code) == [], code


def test_the_check_finds_an_os_read_with_no_bounded_select_before_it():
    assert _found_in_lock_module("data = os.read(fd, 4096)") == [(None, "os.read")]
    found = _found_in_lock_module("select.select([fd], [], [])\ndata = os.read(fd, 4096)")
    assert (None, "os.read") in found  # a select with no timeout bounds nothing


@pytest.mark.parametrize(
    "code",
    [
        "ready, _, _ = select.select([fd], [], [], 0.2)\nif ready:\n    data = os.read(fd, 4096)",
        "poller.poll(200)\ndata = os.read(fd, 4096)",
    ],
)
def test_the_check_leaves_an_os_read_after_a_bounded_select_alone(code):
    assert _found_in_lock_module(code) == [], code
