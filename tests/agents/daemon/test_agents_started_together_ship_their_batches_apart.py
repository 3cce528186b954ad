"""Agents started in the same instant do not post their batches in step: each wait between
batches is drawn around ``batch_seconds``, so a fleet's batches drift apart, and the mean period
stays ``batch_seconds``.

Why: the hosts of one training job start together, and a fixed period kept their agents' batches
in the same instant for ever (200 in step: p99 617 ms at the control plane, against 30 ms spread;
docs/benchmarks.md). Real agents on the stand-in control plane, each with its own pipeline of
thread stages (cheap to start four).
"""

import itertools
import statistics
import time

from agents.daemon.agent import SHIP_JITTER, Agent, AgentConfig, shipping_period
from agents.pipeline import Pipeline, Stage

from .conftest import STAGES, Consumer, parse, transform

AGENTS = 4
BATCH_S = 0.4
RUN_S = 6.0


def _thread_pipeline() -> Pipeline:
    return Pipeline(
        itertools.count(),
        [Stage(name, fn, workers=1, kind="thread", max_workers=2)
         for name, fn in zip(STAGES, (parse, transform), strict=True)],
        queue_size=8,
        name="counting",
    )  # fmt: skip


def test_the_wait_between_batches_varies_around_the_period(control_plane):
    shipped: list[list[float]] = [[] for _ in range(AGENTS)]
    pipelines = [_thread_pipeline().start() for _ in range(AGENTS)]
    consumers = [Consumer(p).start() for p in pipelines]
    agents = []
    try:
        for i, pipeline in enumerate(pipelines):
            host = control_plane.add_host(STAGES)
            config = AgentConfig(
                url=control_plane.url, host_id=host.id, token=host.token, interval_s=0.05,
                batch_seconds=BATCH_S, poll_wait_s=2.0,
            )  # fmt: skip
            agents.append(Agent(pipeline, config, on_shipped=lambda _, i=i: shipped[i].append(
                time.monotonic())))  # fmt: skip
        for agent in agents:
            agent.start()
        time.sleep(RUN_S)
        cut = time.monotonic()  # the final flushes of stop() come one agent after another
    finally:
        for agent in agents:
            agent.stop()
        for c in consumers:
            c.stop()
        for p in pipelines:
            p.stop()
    shipped = [[t for t in times if t <= cut] for times in shipped]
    gaps = [b - a for times in shipped for a, b in itertools.pairwise(times)]
    assert len(gaps) >= AGENTS * 8, f"too few batches: {[len(t) for t in shipped]}"
    # Uniform within 20% either side: a standard deviation of 0.115 x the period (46 ms); a
    # fixed period varies by the few milliseconds of a flush.
    spread = statistics.pstdev(gaps)
    print(f"gaps: mean {statistics.fmean(gaps):.3f} s, standard deviation {spread:.4f} s")
    assert spread > 0.05 * BATCH_S, f"the period does not vary: {spread:.4f} s"
    assert abs(statistics.fmean(gaps) - BATCH_S) < 0.25 * BATCH_S, statistics.fmean(gaps)


def test_the_period_is_drawn_within_the_jitter_either_side():
    assert shipping_period(5.0, lambda: 0.0) == 5.0 * (1 - SHIP_JITTER)
    assert shipping_period(5.0, lambda: 1.0) == 5.0 * (1 + SHIP_JITTER)
    assert shipping_period(5.0, lambda: 0.5) == 5.0
