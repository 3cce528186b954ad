"""A status-only batch (no samples) reports an allocation decision; the agent's ``on_shipped``
callback (the CLI keeps the last shipped sequence number with it) is called only for batches
that carried samples, and shipping goes on without an error."""

import logging

from agents.daemon.agent import Agent, AgentConfig


def test_a_status_only_batch_after_the_first_allocation_raises_nothing(
    control_plane, pipeline, consumer, wait_for, caplog
):
    host = control_plane.add_host(["parse", "transform"])
    config = AgentConfig(
        url=control_plane.url, host_id=host.id, token=host.token, interval_s=60.0,
        batch_seconds=0.2, poll_wait_s=2.0,
    )  # fmt: skip
    shipped: list[int] = []
    agent = Agent(pipeline, config, on_shipped=shipped.append)
    with caplog.at_level(logging.ERROR, logger="agents.daemon"), agent:
        wait_for(
            lambda: any(s.get("applied_version") == 1 for s in host.statuses),
            timeout=5,
            what="the applied default allocation to be reported",
        )
        assert not host.samples, "the report went without samples (none was taken yet)"
        # The shipper sends one batch at a time: once this sample is shipped, the callback of
        # the status-only batch before it has run.
        agent.buffer.append(agent.take_sample())
        wait_for(lambda: shipped, timeout=5, what="a batch with a sample to be shipped")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, f"the shipper logged: {[r.getMessage() for r in errors]}"
    assert shipped == [agent.last_seq], "on_shipped gets the last seq of batches with samples"
