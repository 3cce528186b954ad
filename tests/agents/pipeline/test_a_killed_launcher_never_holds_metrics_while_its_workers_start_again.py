"""A launcher killed on a loaded host holds neither the agent's ``metrics()`` nor ``apply()``
while its workers start again: the monitor's replacements wait for the new launcher's
answers ``START_WAIT_S`` in all (its next round, 0.1 s later, takes those left). Before, the
monitor waited up to ``START_WAIT_S`` for each worker's answer under the pipeline's lock, one
worker after the other, and ``metrics()`` waited behind it: 4.4 s once in the pipeline hunter at load 21
(``python -m tests.agents.pipeline.hunt --replay 90100``). Here the new launcher forks each
worker slowly (a loaded host's fork), and every item still comes once, in order."""

from __future__ import annotations

import math
import os
import signal
import threading
import time

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.pipeline import Pipeline, Stage, zygote

# A call's bound: START_WAIT_S (0.5 s) and the new launcher's own fork under the lock, on 2
# shared loaded cores. Before the fix the monitor held the lock about workers x fork_s, 1.2 s
# and more.
PROMPT_S = 1.0

_slow_forks = {"s": 0.0}  # read in the launcher: set before the kill, so only the new one is slow
_real_fork_worker = zygote._fork_worker


def _slow_fork_worker(*args, **kwargs):
    time.sleep(_slow_forks["s"])
    return _real_fork_worker(*args, **kwargs)


def slow(x: int) -> int:
    time.sleep(0.002)
    return x


@pytest.mark.timeout(180)
@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    workers=st.integers(4, 6),
    stages=st.integers(1, 2),
    fork_s=st.sampled_from([0.3, 0.4]),
    kill_twice=st.booleans(),
)
def test_metrics_answer_promptly_while_a_killed_launchers_workers_start_again(
    monkeypatch, workers, stages, fork_s, kill_twice
):
    monkeypatch.setattr(zygote, "_fork_worker", _slow_fork_worker)
    monkeypatch.setitem(_slow_forks, "s", 0.0)
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    items = 400
    each = math.ceil(workers / stages)
    pipeline = Pipeline(
        range(items),
        [Stage(f"s{k}", slow, workers=each, max_workers=8) for k in range(stages)],
        item_timeout_s=30.0,
    )
    pipeline.start()
    got: list[int] = []
    slowest = [0.0]
    done = threading.Event()

    def agent() -> None:
        while not done.is_set():
            began = time.monotonic()
            pipeline.metrics()
            slowest[0] = max(slowest[0], time.monotonic() - began)
            done.wait(0.02)

    watcher = threading.Thread(target=agent, daemon=True)
    try:
        it = iter(pipeline)
        got += [next(it) for _ in range(20)]
        _slow_forks["s"] = fork_s
        watcher.start()
        for _ in range(2 if kill_twice else 1):
            os.kill(pipeline._zygote.pid, signal.SIGKILL)
            got += [next(it) for _ in range(20)]
        got += list(it)
        done.set()
        watcher.join(5)
        assert slowest[0] < PROMPT_S, f"metrics() took {slowest[0]:.2f} s"
        assert got == list(range(items))
    finally:
        done.set()
        pipeline.stop()
    time.sleep(0.3)
    left = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
    assert not [c for c in left if c.status() != psutil.STATUS_ZOMBIE], left
