"""A worker budget above what the host can run is allowed, and said at start.

``--worker-budget 64`` on a 2-CPU host started silently ("budget 64 CPU slots"); the tuner
then may allocate more CPU than there is and the workers time-slice.
"""

import logging

from agents.budget import cpu_slots
from agents.daemon.agent import Agent, AgentConfig


def config(control_plane, host, **options):
    return AgentConfig(url=control_plane.url, host_id=host.id, token=host.token, **options)


def test_a_budget_above_the_hosts_slots_is_warned_of_naming_both(control_plane, pipeline, caplog):
    host = control_plane.add_host(["parse", "transform"])
    with caplog.at_level(logging.WARNING, logger="agents.daemon"):
        agent = Agent(pipeline, config(control_plane, host, worker_budget=500))
    slots = cpu_slots(agent.host.limits.cpus, 2)
    assert agent.worker_budget == 500, "the person's budget is kept"
    assert f"the worker budget of 500 CPU slots is more than this host's {slots}" in caplog.text
    assert "Lower --worker-budget" in caplog.text


def test_the_default_budget_and_a_smaller_one_are_not_warned_of(control_plane, pipeline, caplog):
    host = control_plane.add_host(["parse", "transform"])
    with caplog.at_level(logging.WARNING, logger="agents.daemon"):
        Agent(pipeline, config(control_plane, host))
        Agent(pipeline, config(control_plane, host, worker_budget=2))
    assert "worker budget" not in caplog.text
