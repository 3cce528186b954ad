"""A launcher that does not answer (stopped here; swapped out under memory pressure on a real
host) holds neither ``apply()`` nor the agent's ``metrics()``: a worker's start waits for the
launcher's answer at most ``START_WAIT_S`` under the pipeline's lock, and only while no
earlier request is unanswered; the monitor finishes the start once the answer comes. Before,
each worker asked for waited up to the request's 10 s timeout holding the lock, and every
``metrics()`` as long (the hunter, ``tests/agents/pipeline/hunt.py``: "metrics() took 12.0 s"
in 3 cases of 22). Then every item comes once, in order, whether the launcher answers late
or not at all within the request's timeout (its workers then replaced)."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.pipeline import Pipeline, Stage, zygote
from agents.pipeline.pool import START_WAIT_S

# A call's bound: the one wait for a first answer, and the machine's load (2 shared cores).
PROMPT_S = START_WAIT_S + 1.0


def slow(x: int) -> int:
    time.sleep(0.002)
    return x


@pytest.mark.timeout(240)
@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    asked=st.integers(2, 6),
    stopped_s=st.sampled_from([2.0, 4.0]),
    past_timeout=st.booleans(),
    kill_a_worker=st.booleans(),
    stages=st.integers(1, 2),
)
def test_apply_and_metrics_answer_promptly_while_the_launcher_is_stopped(
    monkeypatch, asked, stopped_s, past_timeout, kill_a_worker, stages
):
    # Past the timeout: the requests are given up, the workers replaced once it runs again.
    monkeypatch.setattr(zygote, "_REQUEST_TIMEOUT_S", 1.0 if past_timeout else 10.0)
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    items = 400
    pipeline = Pipeline(
        range(items),
        [Stage(f"s{k}", slow, workers=1, max_workers=8) for k in range(stages)],
        item_timeout_s=30.0,
    )
    pipeline.start()
    got = []
    slowest: list[float] = [0.0]
    done = threading.Event()

    def agent() -> None:
        while not done.is_set():
            began = time.monotonic()
            pipeline.metrics()
            slowest[0] = max(slowest[0], time.monotonic() - began)
            done.wait(0.02)

    try:
        it = iter(pipeline)
        got += [next(it) for _ in range(20)]
        launcher = pipeline._zygote.pid
        watcher = threading.Thread(target=agent, daemon=True)
        watcher.start()
        os.kill(launcher, signal.SIGSTOP)
        try:
            if kill_a_worker:  # the monitor's replacement asks the stopped launcher too
                pipeline._pools[0].active[0].signal(signal.SIGKILL)
                time.sleep(0.3)
            began = time.monotonic()
            pipeline.apply({"s0": asked})
            applied_in = time.monotonic() - began
            time.sleep(stopped_s)
        finally:
            os.kill(launcher, signal.SIGCONT)
        got += list(it)
        done.set()
        watcher.join(5)
        assert applied_in < PROMPT_S, f"apply() took {applied_in:.1f} s"
        assert slowest[0] < PROMPT_S, f"metrics() took {slowest[0]:.1f} s"
        assert got == list(range(items))
        assert pipeline.allocation["s0"] == asked
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:  # the late starts finish in the monitor
            workers = [w for w in pipeline._pools[0].active if w.pid is not None]
            if len(workers) == asked:
                break
            time.sleep(0.05)
        assert len(workers) == asked, f"{len(workers)} of {asked} workers started"
    finally:
        done.set()
        pipeline.stop()
    time.sleep(0.3)
    left = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
    assert not [c for c in left if c.status() != psutil.STATUS_ZOMBIE], left
