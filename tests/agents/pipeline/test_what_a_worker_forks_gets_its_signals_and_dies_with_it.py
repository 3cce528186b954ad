"""What a worker's code forks gets the group signals as anywhere else, even one sent the
moment it is forked, and does not outlive the worker (nor the pipeline).

A worker ignores SIGTERM with a handler that does nothing; its children get Python's
defaults back in an at-fork hook. A SIGTERM that reached a child before that hook ran went to
the inherited handler (or was dropped by Python's after-fork reset) and was lost: on a busy
host, a ``multiprocessing.Pool``'s second process, not yet scheduled when ``Pool.__exit__``
SIGTERMed it, lived on, and ``Pool.terminate`` joined it for ever (the epoch hung, 1 run of 8
beside two busy loops). The first test makes that moment long by an at-fork hook that sleeps
before ours: on the old code the child lived through the SIGTERM (exit code 0)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from tests.support.processes import still_running

ROOT = Path(__file__).resolve().parents[3]

# A child of a worker that is slow to come to (a loaded host): an at-fork hook registered
# before agents.pipeline's own runs first, and sleeps.
_SLOW_FORKS = """
import os, time
os.register_at_fork(after_in_child=lambda: time.sleep(0.3))
"""

_SIGTERM_AT_ONCE = _SLOW_FORKS + textwrap.dedent(
    """
    import signal, sys, time
    from agents.pipeline import Pipeline, Stage

    def fork_and_terminate(_):
        pid = os.fork()
        if pid == 0:
            time.sleep(5)
            os._exit(0)
        os.kill(pid, signal.SIGTERM)  # at once: the child is still in its at-fork hooks
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return "lived through SIGTERM"

    with Pipeline(range(2), [Stage("fork", fork_and_terminate, workers=1)], name="t") as p:
        print(list(p), flush=True)
    """
)


def _run(script: str, timeout: float = 60) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_sigterm_sent_to_a_workers_child_as_it_is_forked_kills_it():
    assert _run(_SIGTERM_AT_ONCE) == str([-signal.SIGTERM] * 2)


def _forks_a_sleeper(pids_file: str):
    """A stage function that forks a child which sleeps (as a pool's process waits for
    work), and double-forks a grandchild that its parent leaves orphaned at once. Each is
    noted in ``pids_file`` as a line "worker pid, its pid"."""

    def fn(x):
        child = os.fork()
        if child == 0:
            time.sleep(60)
            os._exit(0)
        middle = os.fork()
        if middle == 0:
            orphan = os.fork()
            if orphan == 0:
                time.sleep(60)
                os._exit(0)
            with open(pids_file, "a") as out:
                out.write(f"{os.getppid()} {orphan}\n")
            os._exit(0)
        os.waitpid(middle, 0)
        with open(pids_file, "a") as out:
            out.write(f"{os.getpid()} {child}\n")
        return x

    return fn


def _started(pids_file: str) -> list[tuple[int, int]]:
    """(worker pid, pid) of each process ``_forks_a_sleeper`` noted."""
    with open(pids_file) as lines:
        return [(int(w), int(p)) for w, p in (line.split() for line in lines if line.strip())]


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids still running (not zombies) after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        alive = still_running(pids)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def test_what_a_killed_worker_started_dies_with_it(tmp_path):
    from agents.pipeline import Pipeline, Stage

    pids_file = str(tmp_path / "pids")
    pipeline = Pipeline(
        range(1_000_000), [Stage("fork", _forks_a_sleeper(pids_file), workers=1)], name="t"
    )
    with pipeline as p:
        items = iter(p)
        next(items)
        worker = psutil.Process(p._zygote.pid).children()[0]
        worker.kill()
        psutil.wait_procs([worker], timeout=5)
        # What the killed worker started (its replacement's own sleepers live on, rightly).
        started = [int(p) for w, p in _started(pids_file) if w == worker.pid]
        assert len(started) >= 2
        # Its child by PR_SET_PDEATHSIG, its orphan by the launcher, which adopted it.
        assert _gone_within(started, 5.0) == []
        next(items)  # the pipeline goes on with another worker


def test_nothing_a_worker_started_outlives_the_pipeline(tmp_path):
    from agents.pipeline import Pipeline, Stage

    pids_file = str(tmp_path / "pids")
    with Pipeline(
        range(1_000_000), [Stage("fork", _forks_a_sleeper(pids_file), workers=2)], name="t"
    ) as p:
        items = iter(p)
        for _ in range(4):
            next(items)
    started = [p for _, p in _started(pids_file)]
    assert len(started) >= 8
    assert _gone_within(started, 5.0) == []
