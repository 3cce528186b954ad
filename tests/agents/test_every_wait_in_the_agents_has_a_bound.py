"""Every blocking call in ``agents/`` has a bound: a timeout, a socket timeout, or a reason
written next to it in the allowlist (``tests/agents/unbounded_waits.py``)."""

from __future__ import annotations

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
