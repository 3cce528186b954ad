"""CPUs taken from the agent's host mid-run (its cpuset shrunk: every thread of the process moved
to fewer CPUs) change the CPUs and the worker budget it reports and checks against within a
sample or two, and giving them back restores both. The CPUs are really taken (sched_setaffinity
on this test's own threads and its pipeline's workers), so the test needs two CPUs."""

import os

import pytest

from agents.budget import cpu_slots
from agents.daemon.agent import Agent, AgentConfig
from benchmarks.online_tuning import set_tree_affinity

CPUS = sorted(os.sched_getaffinity(0))

pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="taking a CPU away needs two")


def test_the_budget_follows_the_cpus_taken_and_given_back(
    control_plane, pipeline, consumer, wait_for
):
    host = control_plane.add_host(["parse", "transform"])
    config = AgentConfig(
        url=control_plane.url,
        host_id=host.id,
        token=host.token,
        interval_s=0.2,
        batch_seconds=0.3,
        poll_wait_s=2.0,
    )
    agent = Agent(pipeline, config).start()
    everything = set(CPUS)

    def newest_host() -> dict:
        return host.samples[max(host.samples)]["host"] if host.samples else {}

    try:
        wait_for(lambda: newest_host().get("cpus") == len(CPUS), what="a first sample")
        assert newest_host()["worker_budget"] == cpu_slots(len(CPUS), 2)
        assert set_tree_affinity(os.getpid(), {CPUS[0]}) > 1
        wait_for(lambda: newest_host().get("cpus") == 1, what="the agent to see one CPU")
        assert newest_host()["worker_budget"] == cpu_slots(1, 2)
        assert agent.worker_budget == cpu_slots(1, 2)
        assert newest_host()["per_cpu_percent"] and len(newest_host()["per_cpu_percent"]) == 1
        set_tree_affinity(os.getpid(), everything)
        wait_for(lambda: newest_host().get("cpus") == len(CPUS), what="the CPUs to come back")
        assert agent.worker_budget == cpu_slots(len(CPUS), 2)
    finally:
        set_tree_affinity(os.getpid(), everything)
        agent.stop()


def test_a_fixed_worker_budget_stays_fixed(control_plane, pipeline, consumer, wait_for):
    host = control_plane.add_host(["parse", "transform"])
    config = AgentConfig(
        url=control_plane.url,
        host_id=host.id,
        token=host.token,
        interval_s=0.2,
        batch_seconds=0.3,
        poll_wait_s=2.0,
        worker_budget=5,
    )
    agent = Agent(pipeline, config).start()
    everything = set(CPUS)
    try:
        set_tree_affinity(os.getpid(), {CPUS[0]})
        wait_for(
            lambda: host.samples and host.samples[max(host.samples)]["host"]["cpus"] == 1,
            what="the agent to see one CPU",
        )
        assert host.samples[max(host.samples)]["host"]["worker_budget"] == 5
    finally:
        set_tree_affinity(os.getpid(), everything)
        agent.stop()
