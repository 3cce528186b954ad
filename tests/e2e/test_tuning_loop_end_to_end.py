"""The walking skeleton, end to end, with real processes: web server, Celery worker, agent, Redis.

A job is registered through the REST API, the agent runs the DLRM pipeline and streams host and
stage metrics, a Celery task decides a new allocation and publishes it, and the agent applies it.
"""

import contextlib
import os
import signal
import time

import pytest

from agents.dlrm.schema import STAGE_NAMES as DLRM_STAGES
from webapp.stack.supervisor import wait_until

pytestmark = pytest.mark.slow


FUSED = "read+parse+transform+collate"
# The agent sends its samples every second (5 s by default): each wait below is on a sample
# that shows what happened, and a batch then arrives within a second rather than five.
AGENT_BATCHES = ("--batch-seconds", "1")


@pytest.fixture(autouse=True)
def _agents_end_with_their_test(live_stack):
    """The agents a test starts are told to stop (SIGTERM) when it ends: left running, each goes
    on sampling and shipping for the rest of the module, on the cores the next test's agent and
    stack need. Not waited for here (a DLRM agent takes seconds to stop on a busy machine): the
    module's stack reaps them when it stops."""
    before = set(live_stack.group.children)
    yield
    for name in set(live_stack.group.children) - before:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(live_stack.group.children[name].pid, signal.SIGTERM)


def tune_end_to_end(live_stack, person, name, stages, *agent_args):
    """Register a job with ``stages`` and a host, start the real agent, start InTune, and wait
    until a policy allocation is applied and the agent's samples show it; return the job id."""
    job_id, host_id, agent_token = live_stack.register_job_and_host(
        person["token"],
        {
            "name": name,
            "stages": [{"name": s} for s in stages],
            # One worker per stage starves the pipeline: InTune's first moves add workers.
            "tuner": "intune",
            "decision_interval_s": 2,
        },
        {"name": f"{name}-host", "cpus": 4, "memory_mb": 8192},
    )
    with live_stack.client(person["token"]) as api:
        started = time.monotonic()
        live_stack.start_agent(
            host_id, agent_token, *AGENT_BATCHES, *agent_args, instance=f"agent-{name}"
        )

        def metrics_arrived():
            series = api.get(
                f"/api/v1/hosts/{host_id}/metrics/", params={"since": time.time() - 120}
            ).json()
            return series if series["series"]["ts"] and series["stages"][stages[0]]["ts"] else None

        series = wait_until(metrics_arrived, 45, interval=1, what="the agent's first metrics")
        assert max(series["series"]["cpus"]) > 0
        assert all(v >= 0 for v in series["stages"][stages[0]]["items_per_s"])

        assert api.post(f"/api/v1/jobs/{job_id}/tuning/", json={}).status_code == 201

        def policy_allocation_applied():
            state = api.get(f"/api/v1/hosts/{host_id}/").json()
            allocation = state["allocation"]
            if allocation["source"] == "policy" and allocation["status"] == "applied":
                return state
            return None

        state = wait_until(
            policy_allocation_applied,
            60 - (time.monotonic() - started),
            interval=1,
            what="a policy allocation applied by the agent",
        )
        assert state["applied_version"] == state["allocation_version"] >= 2
        decisions = api.get(f"/api/v1/hosts/{host_id}/decisions/").json()["results"]
        assert decisions and decisions[-1]["workers"] is not None

        # The agent's next samples report the stage worker counts the policy chose.
        chosen = state["allocation"]["workers"]

        def samples_show_the_new_workers():
            stages = api.get(
                f"/api/v1/hosts/{host_id}/metrics/", params={"since": time.time() - 10}
            ).json()["stages"]
            return all(
                stages[name]["workers"] and stages[name]["workers"][-1] == count
                for name, count in chosen.items()
            )

        wait_until(
            samples_show_the_new_workers,
            30,
            interval=1,
            what="samples measured under the new allocation",
        )

    return job_id


def test_a_decision_made_by_a_celery_task_reaches_the_agent_and_is_applied(live_stack):
    person = live_stack.create_user("e2e-operator", role="operator")
    job_id = tune_end_to_end(live_stack, person, "e2e-dlrm", DLRM_STAGES)

    page = live_stack.client()
    login = page.get("/accounts/login/")
    csrf = login.cookies["csrftoken"]
    page.post(
        "/accounts/login/",
        data={
            "username": "e2e-operator",
            "password": person["password"],
            "csrfmiddlewaretoken": csrf,
        },
        headers={"Referer": f"{live_stack.url}/accounts/login/"},
    )
    job_page = page.get(f"/jobs/{job_id}/")
    assert job_page.status_code == 200
    assert "plotly.min.js" in job_page.text
    assert page.get("/static/vendor/plotly/plotly.min.js").status_code == 200


def test_a_pipeline_with_fused_stages_is_tuned_under_its_fused_names(live_stack):
    person = live_stack.create_user("e2e-fused", role="operator")
    tune_end_to_end(live_stack, person, "e2e-fused", [FUSED, "prefetch"], "--fuse", FUSED)


def test_a_job_with_layout_auto_on_a_small_host_is_fused_by_a_celery_step(live_stack):
    """With ``tuning_options: {"layout": "auto"}`` on 2 CPUs the tuning step (a real Celery
    task) fuses the DLRM stages (the hand-offs cost more than the balance gains there,
    webapp/tuning/layouts.py), the real agent applies the layout live with Pipeline.relayout,
    and its samples, still one row per registered stage, report the group's workers."""
    person = live_stack.create_user("e2e-layout", role="operator")
    job_id, host_id, agent_token = live_stack.register_job_and_host(
        person["token"],
        {
            "name": "e2e-layout",
            "stages": [{"name": s} for s in DLRM_STAGES],
            "tuner": "intune",
            "decision_interval_s": 2,
            "tuning_options": {"layout": "auto"},
        },
        {"name": "e2e-layout-host", "cpus": 2, "memory_mb": 8192},
    )
    with live_stack.client(person["token"]) as api:
        started = time.monotonic()
        live_stack.start_agent(host_id, agent_token, *AGENT_BATCHES, instance="agent-e2e-layout")

        def metrics_arrived():
            series = api.get(
                f"/api/v1/hosts/{host_id}/metrics/", params={"since": time.time() - 120}
            ).json()
            return bool(series["series"]["ts"])

        wait_until(metrics_arrived, 30, interval=0.5, what="the agent's first metrics")
        assert api.post(f"/api/v1/jobs/{job_id}/tuning/", json={}).status_code == 201

        def fused_layout_applied():
            state = api.get(f"/api/v1/hosts/{host_id}/").json()
            allocation = state["allocation"]
            if allocation.get("layout") and allocation["status"] == "applied":
                return state
            return None

        state = wait_until(
            fused_layout_applied,
            max(10.0, 50 - (time.monotonic() - started)),
            interval=0.5,
            what="a layout chosen by the tuning step and applied by the agent",
        )
        allocation = state["allocation"]
        assert allocation["source"] == "policy"
        assert len(allocation["layout"]) < len(DLRM_STAGES)
        assert sorted(allocation["workers"]) == sorted("+".join(g) for g in allocation["layout"])
        group_of = {s: "+".join(g) for g in allocation["layout"] for s in g}

        def samples_show_the_groups():
            stages = api.get(
                f"/api/v1/hosts/{host_id}/metrics/", params={"since": time.time() - 5}
            ).json()["stages"]
            return all(
                stages[name]["workers"]
                and stages[name]["workers"][-1] == allocation["workers"][group_of[name]]
                for name in DLRM_STAGES
            )

        wait_until(samples_show_the_groups, 15, interval=0.5, what="samples in the new layout")
