"""An agent never runs a busy loop against its control plane: it sends one batch a period
however slowly the control plane answers, and rests between polls answered at once with nothing
new. A fleet of agents that did either would add load to a control plane exactly when it is
slow or going down. Real agents on the stand-in control plane; the stand-in's answers are made
slow, or its polls unheld, to stand for a loaded control plane and a proxy that holds none.
"""

import json
import time

from agents.daemon.agent import Agent, AgentConfig

from .conftest import STAGES


def _agent(control_plane, pipeline, **timing) -> tuple:
    """A host registered on the stand-in and an agent for it (not started), with ``timing``'s
    AgentConfig fields (interval_s, poll_wait_s) and a batch a second."""
    host = control_plane.add_host(STAGES)
    config = AgentConfig(
        url=control_plane.url, host_id=host.id, token=host.token, batch_seconds=1.0, **timing
    )
    return host, Agent(pipeline, config)


def test_a_control_plane_slower_than_the_sampling_interval_gets_one_batch_a_period(
    control_plane, pipeline, consumer
):
    # Samples every 50 ms, answers after 250 ms: each batch's trip sees five new samples come
    # in. They wait for the next period; a flush that sent them too posted batch after batch
    # without rest (19 in 5 s here), more load on a control plane exactly when it was slow.
    _, agent = _agent(control_plane, pipeline, interval_s=0.05, poll_wait_s=2.0)
    posts: list[list[int]] = []
    post = agent.client.post_metrics

    def slow_post(body: bytes) -> dict:
        time.sleep(0.25)
        answer = post(body)
        posts.append([s["seq"] for s in json.loads(body)["samples"]])
        return answer

    agent.client.post_metrics = slow_post  # the real post, 250 ms late; one shipper calls it
    agent.start()
    try:
        time.sleep(5.0)
        during = len(posts)
    finally:
        agent.stop()
    # About 5 periods of 1 s (each drawn within 20%); the flush of stop() comes after.
    assert 3 <= during <= 7, f"{during} batches in 5 s at one a second: {[len(p) for p in posts]}"
    seqs = [seq for batch in posts for seq in batch]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "every sample sent once, in order"


def test_polls_answered_at_once_with_nothing_new_are_asked_again_after_a_rest(
    control_plane, pipeline, consumer, wait_for
):
    # A control plane (or a proxy before it) that holds no poll answers each at once with 204;
    # a web process on its way down does the same with the polls it held. An agent that asked
    # again at once ran a busy loop against it (thousands of polls a second, the whole fleet's
    # together); it rests 0.5 to 1 s, drawn, and still takes a new allocation after that rest.
    control_plane.hold_polls = False
    host, agent = _agent(control_plane, pipeline, interval_s=0.2, poll_wait_s=30.0)
    agent.start()
    try:
        time.sleep(3.0)
        polls = control_plane.polls
        control_plane.publish(host.id, {"parse": 2, "transform": 1})
        wait_for(lambda: pipeline.allocation.get("parse") == 2, 5.0, "the allocation taken")
    finally:
        agent.stop()
    assert 3 <= polls <= 7, f"{polls} polls in 3 s"
