"""The web server down for a while: the real agent keeps its pipeline running, buffers its
samples, and once the server is back sends every one of them, once (no gap, no duplicate)."""

import time

import pytest

from webapp.stack.supervisor import wait_until

from .conftest import count_samples, register, start_agent

pytestmark = pytest.mark.slow


def survive_web_outage(stack, agent_state, outage_s: float) -> dict:
    host = register(stack)
    start_agent(stack, host, agent_state, name=f"agent-{host.host_id}")
    wait_until(
        lambda: (count_samples(stack, host.host_id)["n"] or 0) >= 3, 60, what="first samples"
    )

    stack.group.stop("web")
    down_at = time.monotonic()
    before = count_samples(stack, host.host_id)
    time.sleep(outage_s)
    stack.start_service("web")
    stack.wait_healthy()
    back_at = time.monotonic()
    # Every sample taken during the outage arrives: the newest sequence number passes the one
    # the agent had reached when the server went down by at least the outage's length.
    needed = before["last"] + int(outage_s) - 1
    wait_until(
        lambda: (count_samples(stack, host.host_id)["last"] or 0) >= needed, 90, what="the backlog"
    )
    recovered_s = time.monotonic() - back_at
    stack.group.stop(f"agent-{host.host_id}")
    after = count_samples(stack, host.host_id)
    return {
        "before": before,
        "after": after,
        "outage_s": back_at - down_at,
        "recovered_s": recovered_s,
    }


def assert_nothing_lost(figures: dict) -> None:
    after = figures["after"]
    # Contiguous sequence numbers, each stored once, none dropped by the agent's buffer.
    assert after["n"] == after["distinct"] == after["last"] - after["first"] + 1, after
    assert after["dropped"] == 0, after
    assert after["n"] >= figures["before"]["n"] + int(figures["outage_s"]) - 1, figures


def test_the_agent_sends_every_sample_once_after_a_10_s_outage(fault_stack, agent_state):
    # 10 s: the agent buffers ten samples and retries with a growing backoff (0.5 s doubled per
    # failure, jittered); the longer outages below (make soak) take the backoff to its 15 s cap.
    figures = survive_web_outage(fault_stack, agent_state, outage_s=10)
    assert_nothing_lost(figures)
    print(
        f"web down {figures['outage_s']:.0f} s; backlog stored {figures['recovered_s']:.1f} s "
        f"after it came back; {figures['after']['n']} samples, none lost, none twice"
    )


@pytest.mark.soak
def test_the_agent_sends_every_sample_once_after_a_20_s_outage(fault_stack, agent_state):
    figures = survive_web_outage(fault_stack, agent_state, outage_s=20)
    assert_nothing_lost(figures)
    print(
        f"web down {figures['outage_s']:.0f} s; backlog stored {figures['recovered_s']:.1f} s "
        f"after it came back; {figures['after']['n']} samples, none lost, none twice"
    )


@pytest.mark.soak
def test_the_agent_sends_every_sample_once_after_a_60_s_outage(fault_stack, agent_state):
    figures = survive_web_outage(fault_stack, agent_state, outage_s=60)
    assert_nothing_lost(figures)
    print(
        f"web down {figures['outage_s']:.0f} s; backlog stored {figures['recovered_s']:.1f} s "
        f"after it came back; {figures['after']['n']} samples, none lost, none twice"
    )
