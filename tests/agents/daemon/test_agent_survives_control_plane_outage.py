"""The agent against a control plane that goes away and comes back: nothing lost, nothing
duplicated, training never paused. Here against the stand-in (tests.support.standin_control_plane, in memory)
with a short outage; test_agent_against_the_real_control_plane.py does the issue's full 30 s
against the real one.

Delivery is at-least-once: a batch the control plane stored but whose answer the agent never
got (the connection cut as the control plane went away) is sent again, and the control plane
stores each sequence number once (the real one: tests/webapp/test_metrics_ingestion.py's
``test_a_resent_batch_is_acknowledged_and_stored_once`` and
tests/webapp/test_concurrent_copies_of_a_batch.py). So the defect these tests look for is a
resend of samples the agent had been told were stored, seen from the agent (``outage.watch``),
not the control plane's count of duplicates, which a correct resend makes nonzero.
"""

import random
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
    shipping = outage.watch(agent)
    outage_s = 3.0
    run = outage.ride_out(
        agent, consumer, control_plane.stop, control_plane.start, outage_s, wait_for
    )
    outage.assert_nothing_lost_duplicated_or_paused(run, list(host.samples), outage_s)
    assert shipping.resent_acknowledged == [], (
        "the agent resent samples it had been told were stored"
    )
    # Every copy the control plane already had came from a batch the agent never heard back of.
    assert host.duplicates <= shipping.resent_unacknowledged
    assert host.dropped_reported == 0


def test_a_batch_stored_but_never_answered_is_sent_again_and_stored_once(
    control_plane, pipeline, consumer, wait_for, outage
):
    host = control_plane.add_host(STAGES)
    config = outage.config(control_plane.url, host.id, host.token)
    config.first_seq = 1000
    control_plane.hang_up_after_storing = 1
    agent = Agent(pipeline, config)
    shipping = outage.watch(agent)
    with agent:
        wait_for(lambda: host.unanswered, what="a batch stored and hung up on")
        unanswered = host.unanswered[0]
        wait_for(
            lambda: set(unanswered) <= shipping.acknowledged and len(agent.buffer) <= 2,
            what="the agent to send the unanswered batch again and be told it was stored",
        )
    assert shipping.resent_unacknowledged >= len(unanswered) > 0
    assert shipping.resent_acknowledged == []
    # The stand-in stored each of those samples once and told the agent they were duplicates.
    assert host.duplicates == len(unanswered)
    assert agent.duplicates_acknowledged == len(unanswered)
    assert sorted(host.samples) == list(range(1000, agent.last_seq + 1))


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


def test_short_outages_at_random_moments_lose_nothing_and_resend_only_unacknowledged_samples(
    control_plane, pipeline, consumer, wait_for, outage
):
    # Batches every 30 ms, so that some outages cut one between its storing and its answer:
    # under load (two busy loops, load average 11), 7 of 8 runs of a drill of 10 such outages
    # saw the stand-in count duplicates, each a correct resend.
    host = control_plane.add_host(STAGES)
    config = outage.config(control_plane.url, host.id, host.token)
    config.first_seq = 1000
    config.interval_s = 0.02
    config.batch_seconds = 0.03
    config.backoff_initial_s = 0.05
    config.backoff_max_s = 0.2
    agent = Agent(pipeline, config)
    shipping = outage.watch(agent)
    rng = random.Random(7)
    with agent:
        wait_for(lambda: agent.shipped_total >= 5, what="the first samples")
        for _ in range(8):
            time.sleep(rng.uniform(0.05, 0.2))
            control_plane.stop()
            time.sleep(0.05)
            control_plane.start()
        wait_for(
            lambda: len(agent.buffer) <= 2 and agent.last_error is None,
            timeout=30,
            what="the agent to send what it held",
        )
    assert shipping.resent_acknowledged == []
    assert host.duplicates <= shipping.resent_unacknowledged
    assert sorted(host.samples) == list(range(1000, agent.last_seq + 1))
    assert agent.buffer.dropped_total == 0
