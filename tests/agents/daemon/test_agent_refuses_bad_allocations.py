"""Bad allocations (too many workers, zero, unknown stage, over memory, ...) are refused with a
reason reported to the control plane, and change nothing: the real pipeline keeps its workers
and the agent keeps reporting the version in force."""

import functools
import itertools

import pytest

from agents.daemon.agent import Agent, AgentConfig
from agents.pipeline import Pipeline, Stage

from .conftest import Consumer, holding, refusals, transform

BAD = [
    ({"parse": 3, "transform": 3}, "host budget is 4"),  # 2 CPUs + 2 stages on any host below
    ({"parse": 0, "transform": 1}, "at least 1"),
    ({"parse": 1, "transform": 1, "decode": 1}, "unknown stage 'decode'"),
    ({"parse": 1}, "leaves out stage 'transform'"),
    ({"parse": 2.0, "transform": 1}, "whole number"),
    ({"parse": 1, "transform": 5}, "at most 4"),
]


@pytest.mark.parametrize("workers, reason", BAD)
def test_a_bad_allocation_is_refused_with_a_reason_and_changes_nothing(
    agent, control_plane, pipeline, workers, reason, wait_for
):
    agent, host = agent
    before = dict(pipeline.allocation)
    version = control_plane.publish(host.id, workers)
    wait_for(lambda: version in refusals(host), what=f"version {version} to be reported refused")
    assert reason in refusals(host)[version]
    assert pipeline.allocation == before
    assert agent.applied_version == 1
    assert host.statuses[-1]["applied_version"] == 1


def test_an_allocation_over_the_memory_budget_is_refused(control_plane, wait_for):
    # A parse worker that holds memory of its own: what it maps of the process it was forked
    # from is not its cost (agents.pipeline.Pipeline._inherited_rss).
    pipeline = Pipeline(
        itertools.count(),
        [
            Stage("parse", functools.partial(holding, own_mb=16), workers=1, max_workers=4),
            Stage("transform", transform, workers=1, kind="thread", max_workers=4),
        ],
        queue_size=8,
    ).start()
    consumer = Consumer(pipeline).start()
    try:
        wait_for(lambda: len(consumer.items) >= 20, what="the parse worker's first items")
        _refuse_over_memory(control_plane, pipeline, wait_for)
    finally:
        consumer.stop()
        pipeline.stop()


def _refuse_over_memory(control_plane, pipeline, wait_for):
    host = control_plane.add_host(["parse", "transform"])
    config = AgentConfig(
        url=control_plane.url, host_id=host.id, token=host.token, interval_s=0.2, batch_seconds=0.3
    )
    agent = Agent(pipeline, config)
    agent.take_sample()  # measures the parse worker's resident memory
    per_worker = agent.stage_limits()[0].memory_mb_per_worker
    assert per_worker and per_worker > 1.0, "a process worker has a measurable resident set"
    # Room for today's one parse worker and a little more, not for three.
    agent.memory_budget_mb = 1.5 * per_worker
    with agent:
        version = control_plane.publish(host.id, {"parse": 3, "transform": 1})
        wait_for(lambda: version in refusals(host), what="the over-memory refusal")
    assert "memory budget" in refusals(host)[version]
    assert pipeline.allocation == {"parse": 1, "transform": 1}


def test_a_good_allocation_after_refusals_is_applied_live(
    agent, control_plane, pipeline, consumer, wait_for
):
    agent, host = agent
    refused = control_plane.publish(host.id, {"parse": 0, "transform": 1})
    good = control_plane.publish(host.id, {"parse": 2, "transform": 2})
    wait_for(lambda: agent.applied_version == good, what="the good allocation to apply")
    assert pipeline.allocation == {"parse": 2, "transform": 2}
    wait_for(
        lambda: host.statuses and host.statuses[-1].get("applied_version") == good,
        what="the applied version to be reported",
    )
    # The long-poll answers with the newest version only, so the refused one may never arrive;
    # it must never be applied, and versions only grow.
    assert refused not in [s.get("applied_version") for s in host.statuses]
    seen = len(consumer.items)
    wait_for(lambda: len(consumer.items) > seen + 50, what="training to go on after the resize")


def test_an_old_version_is_ignored(agent, pipeline):
    agent, _ = agent
    assert agent.handle_allocation({"version": 1, "workers": {"parse": 3, "transform": 1}}) is None
    assert pipeline.allocation == {"parse": 1, "transform": 1}
