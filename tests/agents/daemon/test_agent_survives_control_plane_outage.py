"""The agent against a control plane that goes away and comes back: nothing lost, nothing
duplicated, training never paused. Here against the stand-in (tests.support.standin_control_plane, in memory)
with a short outage; test_agent_against_the_real_control_plane.py does the issue's full 30 s
against the real one.
"""

import time

from agents.daemon.agent import Agent

STAGES = ["parse", "transform"]


def test_against_the_stand_in_nothing_is_lost_or_duplicated_and_training_goes_on(
    control_plane, pipeline, consumer, wait_for, outage
):
    host = control_plane.add_host(STAGES)
    config = outage.config(control_plane.url, host.id, host.token)
    config.first_seq = 1000
    agent = Agent(pipeline, config)
    outage_s = 3.0
    run = outage.ride_out(
        agent, consumer, control_plane.stop, control_plane.start, outage_s, wait_for
    )
    outage.assert_nothing_lost_duplicated_or_paused(run, list(host.samples), outage_s)
    assert host.duplicates == 0, "the agent resent samples the control plane had acknowledged"
    assert host.dropped_reported == 0


def test_an_allocation_published_after_the_outage_is_applied(
    control_plane, pipeline, consumer, wait_for, outage
):
    host = control_plane.add_host(STAGES)
    with Agent(pipeline, outage.config(control_plane.url, host.id, host.token)) as agent:
        wait_for(lambda: agent.applied_version == 1, what="the default allocation")
        control_plane.stop()
        time.sleep(1.0)
        control_plane.start()
        version = control_plane.publish(host.id, {"parse": 2, "transform": 1})
        wait_for(lambda: agent.applied_version == version, what="the new allocation")
    assert pipeline.allocation == {"parse": 2, "transform": 1}
