"""A Celery worker killed (SIGKILL) mid-session: another worker picks the session up from its
checkpoint, and at most one decision is lost."""

import time

import pytest

from tests.support.live_stack import LiveStack
from webapp.stack.supervisor import wait_until

pytestmark = pytest.mark.slow
STAGES = ["read", "parse", "transform"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, redis_url):
    with LiveStack(
        tmp_path_factory.mktemp("kill"), beat=True, extra_env={"INTUNE_STALLED_AFTER_S": "4"}
    ) as s:
        yield s


def steps_of(api, job_id):
    return api.get(f"/api/v1/jobs/{job_id}/tuning/").json()[0]["steps"]


def test_the_session_resumes_on_another_worker(stack, simulated_agent):
    person = stack.create_user("kill-op", role="operator")
    job_id, host_id, token = stack.register_job_and_host(
        person["token"],
        {"name": "kill", "stages": [{"name": s} for s in STAGES], "decision_interval_s": 1},
        {"name": "h", "cpus": 8, "memory_mb": 16384},
    )
    with stack.client(person["token"]) as api:
        agent = simulated_agent(stack.url, host_id, token, STAGES)
        assert api.post(f"/api/v1/jobs/{job_id}/tuning/", json={}).status_code == 201
        wait_until(lambda: steps_of(api, job_id) >= 3, 60, what="three decisions")

        stack.group.kill("worker")
        killed_at = steps_of(api, job_id)
        stack.start_service("worker", instance="worker-2")
        resumed_at = time.monotonic()
        wait_until(
            lambda: steps_of(api, job_id) >= killed_at + 3,
            60,
            what="three more decisions on the new worker",
        )
        recovery_s = time.monotonic() - resumed_at

        session = api.get(f"/api/v1/jobs/{job_id}/tuning/").json()[0]
        assert session["status"] == "running"
        decisions = api.get(f"/api/v1/hosts/{host_id}/decisions/", params={"limit": 500}).json()[
            "results"
        ]
        steps = sorted(d["step"] for d in decisions)
        # Every step number appears once, none skipped: the killed worker's step was either
        # committed whole or taken again from the checkpoint.
        assert steps == list(range(len(steps)))
        assert len(steps) >= killed_at + 3
        assert not agent.errors, agent.errors[:3]
        print(f"resumed {killed_at + 3 - killed_at} decisions {recovery_s:.1f} s after the kill")
