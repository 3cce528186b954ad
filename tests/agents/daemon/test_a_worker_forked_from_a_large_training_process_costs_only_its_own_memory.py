"""A worker forked from a training process that holds a lot of memory (a DLRM's embedding
tables in host memory, a model, a dataset loaded before the loader started) is measured, and
budgeted, at the memory it holds of its own, not at everything it maps from its parent.

Before, a stage's ``rss_mb`` summed its workers' resident sets, which count every page a
process maps, shared copy-on-write or not: each worker of a training process holding 40 GB
read as 40 GB, and the agent's memory budget refused a second worker that costs a few MB
(here: a parent holding 256 to 512 MB, workers of 0 to 48 MB of their own, read as the
parent's size each, and three of them refused under a budget twice the parent's).

The real pipeline, agent and stand-in control plane; the sizes are generated."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.daemon.agent import Agent
from agents.pipeline import Pipeline, Stage

from .conftest import Consumer, agent_config, holding, refusals

# What a worker maps of its own beyond what it allocates: its stack, the interpreter's
# arenas, the pages of libraries it reads (measured: 1 to 31 MB; a parent's size before).
OVERHEAD_MB = 48


def _publish_three_parse_workers(agent, control_plane, host, wait_for) -> int:
    """Publish parse 3, transform 1 with ``agent`` running; its version once applied or
    refused."""
    with agent:
        version = control_plane.publish(host.id, {"parse": 3, "transform": 1})
        wait_for(
            lambda: agent.applied_version == version or version in refusals(host),
            timeout=30,
            what="the allocation to be applied or refused",
        )
    return version


def plus_one(n: int) -> int:
    return n + 1


@pytest.mark.timeout(240)
@settings(
    max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    parent_mb=st.sampled_from([256, 384, 512]),
    own_mb=st.sampled_from([0, 24, 48]),
    workers=st.integers(1, 3),
)
def test_a_stage_reads_and_is_budgeted_at_its_workers_own_memory(
    control_plane, wait_for, parent_mb, own_mb, workers
):
    ballast = b"\x02" * (parent_mb << 20)  # the training process's memory, before the fork
    pipeline = Pipeline(
        itertools.count(),
        [
            Stage(
                "parse", functools.partial(holding, own_mb=own_mb), workers=workers, max_workers=4
            ),
            Stage("transform", plus_one, workers=1, kind="thread", max_workers=4),
        ],
        queue_size=8,
        name="ballast",
    )
    host = control_plane.add_host(["parse", "transform"])
    config = dataclasses.replace(
        agent_config(control_plane.url, host.id, host.token), memory_budget_mb=2.0 * parent_mb
    )
    consumer = Consumer(pipeline, step_s=0.0)
    try:
        pipeline.start()
        consumer.start()
        wait_for(lambda: len(consumer.items) >= 300, what="300 items through the workers")
        row = next(r for r in pipeline.metrics() if r["name"] == "parse")
        assert row["rss_mb"] < workers * (own_mb + OVERHEAD_MB), (
            f"{workers} worker(s) holding {own_mb} MB each of their own, forked from a process "
            f"holding {parent_mb} MB, read as {row['rss_mb']:.0f} MB"
        )
        if own_mb:
            assert row["rss_mb"] >= 0.8 * own_mb, f"a worker's own {own_mb} MB went uncounted"

        agent = Agent(pipeline, config)
        agent.take_sample()
        version = _publish_three_parse_workers(agent, control_plane, host, wait_for)
        assert agent.applied_version == version, refusals(host).get(version)
        assert pipeline.allocation == {"parse": 3, "transform": 1}
    finally:
        consumer.stop()
        pipeline.stop()
        del ballast


@pytest.mark.timeout(240)
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(outside=st.floats(0.0, 1.2), own_mb=st.sampled_from([8, 16]))
def test_the_default_memory_budget_is_shared_with_what_the_host_holds_besides_the_workers(
    control_plane, wait_for, monkeypatch, outside, own_mb
):
    """Measured at their own memory, the workers no longer carry the trainer's: the default
    budget (80% of the host's limit) is what the host holds besides them taken away, never
    less than what they hold now. The host's memory figures are the test's (the machine's
    own cannot be set): the host in use is ``outside`` of its limit plus the workers' own."""
    pipeline = Pipeline(
        itertools.count(),
        [
            Stage("parse", functools.partial(holding, own_mb=own_mb), workers=1, max_workers=4),
            Stage("transform", plus_one, workers=1, kind="thread", max_workers=4),
        ],
        queue_size=8,
        name="shared",
    )
    host = control_plane.add_host(["parse", "transform"])
    config = agent_config(control_plane.url, host.id, host.token)
    consumer = Consumer(pipeline, step_s=0.0)
    try:
        pipeline.start()
        consumer.start()
        wait_for(lambda: len(consumer.items) >= 100, what="100 items through the workers")
        agent = Agent(pipeline, config)
        limit = agent.host.limits.memory_limit_mb
        real_sample = agent.host.sample
        held = {}

        def sample(worker_budget):
            figures = real_sample(worker_budget)
            figures["memory_used_mb"] = outside * limit + held.get("mb", 0.0)
            return figures

        monkeypatch.setattr(agent.host, "sample", sample)
        pipeline.metrics()
        held["mb"] = next(r for r in pipeline.metrics() if r["name"] == "parse")["rss_mb"]
        assert held["mb"] >= 0.8 * own_mb
        agent.take_sample()
        budget = agent.memory_budget_now()
        expected = max(0.8 * limit - outside * limit, agent._memory_held_mb)
        assert budget == pytest.approx(expected, abs=1.0)
        # Three parse workers need about three times what one holds: applied exactly when
        # the budget has room for them.
        needed = 3 * held["mb"]
        version = _publish_three_parse_workers(agent, control_plane, host, wait_for)
        if needed <= 0.9 * budget:
            assert agent.applied_version == version, refusals(host).get(version)
        elif needed >= 1.1 * budget:
            assert "memory budget" in refusals(host)[version]
    finally:
        consumer.stop()
        pipeline.stop()
