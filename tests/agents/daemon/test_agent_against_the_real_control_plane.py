"""The agent against the real control plane (Django web server and Celery worker as processes,
from tests/conftest.py's ``live_control_plane``).

- It goes away (the web process is stopped, then started again on the same port and
  database): nothing lost, nothing duplicated, training never paused. 10 s in ``make test``;
  the issue's full 30 s under ``make soak``. ``INTUNE_OUTAGE_S`` sets the first's length.
- An allocation the control plane accepts but this host's agent must refuse (a stage's
  max_workers that only the pipeline knows) is refused, changes nothing, and the refusal with
  its reason reaches the control plane.
"""

import json
import os
import time

import pytest

from agents.daemon.agent import Agent

STAGES = ["parse", "transform"]
LIVE_OUTAGE_S = float(os.environ.get("INTUNE_OUTAGE_S", "10"))
FULL_OUTAGE_S = 30.0


def stored_seqs_in_database(stack, host_id: int) -> list[int]:
    """Every sequence number the real control plane stored for a host, duplicates included."""
    code = (
        "import json; from webapp.ingestion.models import HostSample; "
        f"print(json.dumps(list(HostSample.objects.filter(host_id={host_id})"
        ".values_list('seq', flat=True))))"
    )
    return json.loads(stack.manage("shell", "-c", code).strip().splitlines()[-1])


def ride_out_a_web_outage(live_control_plane, pipeline, consumer, wait_for, outage, seconds):
    stack = live_control_plane.stack
    _, host_id, token = live_control_plane.register(STAGES, cpus=2)
    config = outage.config(live_control_plane.url, host_id, token)
    config.first_seq = time.time_ns() // 10**6
    agent = Agent(pipeline, config)
    shipping = outage.watch(agent)

    def come_back():
        stack.start_service("web")
        stack.wait_healthy()

    run = outage.ride_out(
        agent,
        consumer,
        lambda: stack.group.stop("web"),
        come_back,
        seconds,
        wait_for,
        server_log=lambda: stack.log("web"),
    )
    # Stored once each, though a batch stored as the web process went away is sent again.
    outage.assert_nothing_lost_duplicated_or_paused(
        run, stored_seqs_in_database(stack, host_id), seconds
    )
    assert shipping.resent_acknowledged == [], (
        "the agent resent samples it had been told were stored"
    )


@pytest.mark.slow
def test_against_the_real_control_plane_gone_a_while_nothing_is_lost_or_duplicated(
    live_control_plane, pipeline, consumer, wait_for, outage
):
    ride_out_a_web_outage(live_control_plane, pipeline, consumer, wait_for, outage, LIVE_OUTAGE_S)


@pytest.mark.soak
def test_against_the_real_control_plane_gone_30_s_nothing_is_lost_or_duplicated(
    live_control_plane, pipeline, consumer, wait_for, outage
):
    ride_out_a_web_outage(live_control_plane, pipeline, consumer, wait_for, outage, FULL_OUTAGE_S)


def test_a_refused_allocation_reaches_the_real_control_plane_with_its_reason(
    live_control_plane, pipeline, consumer, wait_for, outage
):
    # The job declares no max_workers, so the control plane accepts 5 transform workers; this
    # host's pipeline allows at most 4 (tests/agents/daemon/conftest.py), so its agent refuses.
    _, host_id, token = live_control_plane.register(STAGES, cpus=2, worker_budget=10)
    config = outage.config(live_control_plane.url, host_id, token)
    config.worker_budget = 10
    with Agent(pipeline, config) as agent:
        wait_for(lambda: agent.applied_version == 1, timeout=30, what="the default allocation")
        with live_control_plane.stack.client(live_control_plane.api_token) as person:
            answer = person.put(
                f"/api/v1/hosts/{host_id}/override/",
                json={"workers": {"parse": 1, "transform": 5}, "reason": "more transform"},
            )
            assert answer.status_code == 200, answer.text

            def newest():
                return person.get(f"/api/v1/hosts/{host_id}/").json()["allocation"]

            wait_for(lambda: newest()["status"] == "refused", timeout=30, what="the refusal")
            refused = newest()
    assert (
        "'transform' asks for 5 workers but the stage allows at most 4"
        in (refused["refusal_reason"])
    )
    assert pipeline.allocation == {"parse": 1, "transform": 1}
    assert agent.applied_version == 1
