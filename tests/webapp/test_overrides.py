"""A person's override: validated, published, pauses the policy until released or expired."""

from datetime import timedelta

import pytest
from django.utils import timezone

from webapp.jobs.models import Allocation, AuditEntry
from webapp.tuning.models import Override
from webapp.tuning.tasks import expire_overrides


def override_url(host):
    return f"/api/v1/hosts/{host.pk}/override/"


def test_an_operator_override_publishes_an_allocation_and_is_audited(api, operator, job_and_host):
    job, host, _ = job_and_host
    workers = {"read": 2, "parse": 3, "transform": 3, "collate": 1, "prefetch": 1}
    response = api.as_user(operator).put(
        override_url(host), {"workers": workers, "reason": "testing a hunch"}, format="json"
    )
    assert response.status_code == 200, response.content
    newest = Allocation.objects.filter(host=host).order_by("-version").first()
    assert newest.workers == workers and newest.source == "override" and newest.version == 2
    assert newest.created_by == operator
    entry = AuditEntry.objects.get(action="override.set")
    assert entry.actor == operator and entry.details["reason"] == "testing a hunch"


@pytest.mark.parametrize(
    "workers, message",
    [
        (
            {"read": 20, "parse": 1, "transform": 1, "collate": 1, "prefetch": 1},
            "the host budget is 13 CPU slots",
        ),
        (
            {"read": 0, "parse": 1, "transform": 1, "collate": 1, "prefetch": 1},
            "stage 'read' asks for 0 workers",
        ),
        ({"read": 1, "parse": 1}, "leaves out stage 'transform'"),
        (
            {"read": 1, "parse": 1, "transform": 1, "collate": 1, "prefetch": 1, "bogus": 1},
            "unknown stage 'bogus'",
        ),
        (
            {"read": 1.5, "parse": 1, "transform": 1, "collate": 1, "prefetch": 1},
            "whole numbers",
        ),
    ],
)
def test_an_invalid_override_is_refused_with_the_limit_and_changes_nothing(
    api, operator, job_and_host, workers, message
):
    _, host, _ = job_and_host
    response = api.as_user(operator).put(
        override_url(host), {"workers": workers, "reason": "x"}, format="json"
    )
    assert response.status_code == 400
    assert message in response.json()["detail"]
    assert Allocation.objects.filter(host=host).count() == 1
    assert not Override.objects.exists()


def test_an_override_over_the_memory_budget_is_refused(api, operator, make_job, make_host):
    job = make_job(stages=["read", "parse"])
    job.stages.filter(name="parse").update(memory_mb_per_worker=3000)
    host, _ = make_host(job, cpus=8, memory_mb=8000)
    response = api.as_user(operator).put(
        override_url(host), {"workers": {"read": 1, "parse": 3}, "reason": "x"}, format="json"
    )
    assert response.status_code == 400
    assert "memory" in response.json()["detail"]


def test_releasing_hands_the_host_back_to_the_policy(api, operator, job_and_host):
    from webapp.tuning.services import active_override

    job, host, _ = job_and_host
    client = api.as_user(operator)
    client.put(
        override_url(host),
        {"workers": {s: 1 for s in job.stage_names}, "reason": "hold still"},
        format="json",
    )
    assert active_override(host) is not None
    assert client.delete(override_url(host)).json() == {"released": 1}
    assert active_override(host) is None
    assert AuditEntry.objects.filter(action="override.release").exists()


def test_an_override_expires_by_itself(operator, job_and_host):
    from webapp.tuning.services import active_override, set_override

    job, host, _ = job_and_host
    override = set_override(
        host,
        operator,
        workers={s: 1 for s in job.stage_names},
        reason="brief",
        expires_at=timezone.now() + timedelta(seconds=30),
    )
    Override.objects.filter(pk=override.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert expire_overrides() == 1
    assert active_override(host) is None
    assert Override.objects.get(pk=override.pk).end_reason == "expired"


def test_an_expiry_in_the_past_is_refused(api, operator, job_and_host):
    job, host, _ = job_and_host
    response = api.as_user(operator).put(
        override_url(host),
        {
            "workers": {s: 1 for s in job.stage_names},
            "reason": "x",
            "expires_at": "2001-01-01T00:00:00Z",
        },
        format="json",
    )
    assert response.status_code == 400
    assert "future" in response.json()["detail"]
