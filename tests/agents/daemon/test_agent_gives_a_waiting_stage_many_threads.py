"""The agent measures which stages wait: it accepts many threads for a stage whose workers
sleep on I/O, past one worker per CPU, yet still refuses an allocation whose computing workers
are over the host's CPU slots."""

import itertools
import time

import pytest

from agents.daemon.agent import Agent, AgentConfig
from agents.pipeline import Pipeline, Stage

from .conftest import Consumer, refusals


def fetch(n: int) -> int:
    time.sleep(0.02)  # a GET from an object store: the thread waits, the CPU does not
    return n


def parse(n: int) -> int:
    deadline = time.thread_time() + 0.004  # CPU work, however busy the machine is
    while time.thread_time() < deadline:
        pass
    return n


@pytest.fixture
def waiting_pipeline():
    p = Pipeline(
        itertools.count(),
        [
            Stage("fetch", fetch, kind="thread", max_workers=64),
            Stage("parse", parse, kind="thread", max_workers=8),
        ],
        queue_size=8,
        name="object-store",
    ).start()
    consumer = Consumer(p, step_s=0.0).start()
    yield p
    consumer.stop()
    p.stop()


@pytest.fixture
def agent(control_plane, waiting_pipeline, wait_for):
    host = control_plane.add_host(["fetch", "parse"])
    config = AgentConfig(
        url=control_plane.url,
        host_id=host.id,
        token=host.token,
        interval_s=0.2,
        batch_seconds=0.3,
        worker_budget=4,  # 2 CPUs + 2 stages
        poll_wait_s=2.0,
    )
    agent = Agent(waiting_pipeline, config).start()
    wait_for(lambda: agent.applied_version == 1, what="the default allocation to be applied")
    wait_for(
        lambda: agent.stage_limits()[0].waits,
        timeout=30,
        what="the agent to measure that fetch's workers wait",
    )
    yield agent, host
    agent.stop()


def test_sixteen_fetch_threads_fit_a_budget_of_four_cpu_slots(
    agent, control_plane, waiting_pipeline, wait_for
):
    agent, host = agent
    fetch_limits, parse_limits = agent.stage_limits()
    assert fetch_limits.worker_cpu < 0.25, "a sleeping thread uses a sliver of a CPU"
    assert parse_limits.worker_cpu == 1.0, "a spinning thread computes"
    version = control_plane.publish(host.id, {"fetch": 16, "parse": 2})
    wait_for(lambda: agent.applied_version == version, what="sixteen fetch threads to apply")
    assert waiting_pipeline.allocation == {"fetch": 16, "parse": 2}


def test_computing_workers_over_the_cpu_slots_are_still_refused(
    agent, control_plane, waiting_pipeline, wait_for
):
    agent, host = agent
    version = control_plane.publish(host.id, {"fetch": 1, "parse": 4})
    wait_for(lambda: version in refusals(host), what="the over-budget refusal")
    assert "the host budget is 4 CPU slots" in refusals(host)[version]
    assert waiting_pipeline.allocation == {"fetch": 1, "parse": 1}
