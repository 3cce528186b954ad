"""What a worker ``exec``s (a ``subprocess``, a shell and what it backgrounds) does not
outlive a launcher killed outright (SIGKILL, the OOM killer), whether the pipeline goes on
or is stopped at once.

A worker's ``subprocess`` gets no at-fork hook (so no death signal), and was left, when its
worker died, to the launcher, which adopts and ends such orphans. A launcher killed outright
dies before its workers, and what they had exec'd went to init and ran on: a ``sleep`` still
there after the pipeline's stop, ``ppid`` 1 (probe of 2026-11-25). Every process under a
launcher now carries the pipeline's mark in its environment, and the pipeline ends the marked
processes when it finds its launcher killed (``agents.pipeline.zygote.end_marked``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import psutil
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.pipeline import Pipeline, Stage
from tests.support.processes import still_running


def _starts(command: str, tag: str):
    """A stage function that, on each worker's first item, starts ``command`` (tagged by a
    unique number of seconds to sleep)."""
    started: set[int] = set()

    def fn(x):
        if os.getpid() not in started:
            started.add(os.getpid())
            if command == "subprocess":
                subprocess.Popen(["sleep", tag])
            elif command == "cleared_env":  # no mark: found by the launcher's process group
                subprocess.Popen(["sleep", tag], env={"PATH": os.environ.get("PATH", "")})
            else:  # a shell that waits on its own child
                subprocess.Popen(["sh", "-c", f"sleep {tag}; true"])
        time.sleep(0.01)
        return x

    return fn


def _tagged(tag: str) -> list[int]:
    """The running processes whose command line sleeps ``tag`` seconds."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if process.info["cmdline"] == ["sleep", tag]:
            found.append(process.pid)
    return still_running(found)


def _under(pid: int, workers: set[int]) -> bool:
    """Whether ``pid`` descends (within 3 generations) from one of ``workers``."""
    try:
        process = psutil.Process(pid)
        for _ in range(3):
            process = process.parent()
            if process is None:
                return False
            if process.pid in workers:
                return True
    except psutil.Error:
        return True  # gone meanwhile
    return False


def _orphans_within(tag: str, workers: set[int], seconds: float) -> list[int]:
    """The tagged processes not under one of ``workers`` still running after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        left = [pid for pid in _tagged(tag) if not _under(pid, workers)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    workers=st.integers(1, 3),
    command=st.sampled_from(["subprocess", "shell"]),
    then=st.sampled_from(["go_on", "stop"]),
)
def test_what_a_killed_launchers_workers_exec_is_ended(workers, command, then):
    _killed_launcher_case(workers, command, then)


@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(workers=st.integers(1, 3), then=st.sampled_from(["go_on", "stop"]))
def test_what_a_killed_launchers_workers_exec_with_a_cleared_environment_is_ended(workers, then):
    # It carries no mark (env={...}); it is in the launcher's process group, which the
    # pipeline SIGKILLs before it reaps the launcher. Before, it ran on under init.
    _killed_launcher_case(workers, "cleared_env", then)


def _killed_launcher_case(workers: int, command: str, then: str) -> None:
    tag = f"{1000 + uuid.uuid4().int % 9000}.{os.getpid() % 1000}"
    items = 60
    pipeline = Pipeline(
        range(items),
        [Stage("exec", _starts(command, tag), workers=workers, max_workers=3)],
        name="t",
    )
    try:
        pipeline.start()
        it = iter(pipeline)
        got = [next(it) for _ in range(10)]
        deadline = time.monotonic() + 10
        while not _tagged(tag) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _tagged(tag), "no worker started its process"
        os.kill(pipeline._zygote.pid, signal.SIGKILL)
        if then == "go_on":
            got += list(it)  # the pipeline replaces its launcher and goes on
            assert got == list(range(items))
            # Those of the killed launcher's workers are gone; the new workers' own live on.
            live = {w.pid for pool in pipeline._pools for w in pool.active if w.pid is not None}
            assert _orphans_within(tag, live, 5.0) == [], "the killed launcher's are left"
    finally:
        pipeline.stop()
    assert _orphans_within(tag, set(), 5.0) == [], "processes left after stop()"
