"""Workers never outlive their pipeline: after stop(), an early break, an error, or the
pipeline's own process being killed."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from agents.pipeline.examples import counting

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _others():
    """Processes this test session had before the test (an embedded Redis server, say)."""
    _BEFORE.clear()
    _BEFORE.update(p.pid for p in psutil.Process().children(recursive=True))


_BEFORE: set[int] = set()


def _workers_of(pid: int) -> list[psutil.Process]:
    """The processes under ``pid`` (the launcher and the workers), less those that were
    there before the test."""
    return [
        p
        for p in psutil.Process(pid).children(recursive=True)
        if p.is_running() and p.pid not in _BEFORE
    ]


def _gone_soon(processes: list[psutil.Process], within: float = 3.0) -> bool:
    _, alive = psutil.wait_procs(processes, timeout=within)
    return not alive


def test_stop_ends_every_worker_process():
    pipeline = counting(n=None, stages=3).start()
    pipeline.apply({"s0": 3, "s1": 2})
    started = _workers_of(os.getpid())
    assert len(started) >= 6
    pipeline.stop()
    assert _gone_soon(started)


def test_a_consumer_that_breaks_early_leaves_nothing_behind():
    with counting(n=None, stages=2, work_ms=1) as pipeline:
        started = _workers_of(os.getpid())
        for i, _ in enumerate(pipeline):
            if i == 10:
                break
    assert _gone_soon(started)


def test_an_exception_in_the_consumer_leaves_nothing_behind():
    started = []
    with pytest.raises(RuntimeError, match="consumer failed"):
        with counting(n=None, stages=2) as pipeline:
            started = _workers_of(os.getpid())
            next(iter(pipeline))
            raise RuntimeError("consumer failed")
    assert started
    assert _gone_soon(started)


def test_workers_exit_when_the_pipelines_process_is_killed():
    script = textwrap.dedent(
        """
        import sys, time
        from agents.pipeline.examples import counting
        pipeline = counting(n=None, stages=2, work_ms=1).start()
        pipeline.apply({"s0": 2})
        it = iter(pipeline)
        next(it)
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    try:
        assert parent.stdout.readline().strip() == b"ready"
        workers = _workers_of(parent.pid)
        assert len(workers) >= 3
        parent.send_signal(signal.SIGKILL)  # no cleanup code of the parent runs
        parent.wait()
        assert _gone_soon(workers, within=5.0)
        assert not [f for f in os.listdir("/dev/shm") if f"-{workers[0].pid}-" in f]
    finally:
        parent.kill()
        time.sleep(0)
