"""A host of two ranks whose CPUs change mid-run keeps one slot per stage for each rank.

The agent's budget is the host's CPUs plus one slot per stage per rank (agents.budget.cpu_slots)
when it starts; it was recomputed for one rank when the cpuset changed, so a two-rank host
lost a slot per stage and refused allocations that had fit. The CPUs are really taken
(sched_setaffinity), so the test needs two CPUs.
"""

import os

import pytest

from agents.budget import cpu_slots
from agents.daemon.agent import Agent, AgentConfig
from benchmarks.online_tuning import set_tree_affinity

CPUS = sorted(os.sched_getaffinity(0))

pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="taking a CPU away needs two")


class TwoRanks:
    """The test's pipeline, reported as the pipeline of each of two local ranks."""

    ranks = 2

    def __init__(self, pipeline):
        self._pipeline = pipeline

    def __getattr__(self, name):
        return getattr(self._pipeline, name)


def test_the_budget_after_a_cpu_change_counts_every_rank(
    control_plane, pipeline, consumer, wait_for
):
    host = control_plane.add_host(["parse", "transform"])
    config = AgentConfig(url=control_plane.url, host_id=host.id, token=host.token,
                         interval_s=0.2, batch_seconds=0.3, poll_wait_s=2.0)  # fmt: skip
    agent = Agent(TwoRanks(pipeline), config).start()
    everything = set(CPUS)
    try:
        assert agent.worker_budget == cpu_slots(len(CPUS), 2, ranks=2)
        assert set_tree_affinity(os.getpid(), {CPUS[0]}) > 1
        wait_for(lambda: agent.host.limits.cpus == 1, what="the agent to see one CPU")
        wait_for(lambda: agent.worker_budget != cpu_slots(len(CPUS), 2, ranks=2),
                 what="the budget to follow")  # fmt: skip
        assert agent.worker_budget == cpu_slots(1, 2, ranks=2)
    finally:
        set_tree_affinity(os.getpid(), everything)
        agent.stop()
