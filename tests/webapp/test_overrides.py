"""A person's override: validated, published, pauses the policy until released or expired."""

from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    when=st.datetimes(min_value=datetime(2100, 1, 1), max_value=datetime(9998, 12, 31)),
    offset_minutes=st.one_of(st.none(), st.integers(min_value=-14 * 60, max_value=14 * 60)),
    separator=st.sampled_from(["T", " "]),
)
def test_an_expiry_without_a_utc_offset_is_refused_naming_the_field_and_one_with_it_is_kept(
    api, operator, job_and_host, when, offset_minutes, separator
):
    """A naive time was read as UTC without a word (DRF under USE_TZ): an operator typing
    local time got an override that ended hours off. It is ambiguous: a 400 naming the field."""
    job, host, _ = job_and_host
    text = when.isoformat(sep=separator)
    if offset_minutes is not None:
        text = when.replace(tzinfo=dt_timezone(timedelta(minutes=offset_minutes))).isoformat(
            sep=separator
        )
    versions = Allocation.objects.filter(host=host).count()
    response = api.as_user(operator).put(
        override_url(host),
        {"workers": {s: 1 for s in job.stage_names}, "reason": "x", "expires_at": text},
        format="json",
    )
    if offset_minutes is None:
        assert response.status_code == 400, response.content
        detail = response.json()["detail"]
        assert detail.startswith("expires_at: ") and "no UTC offset" in detail, detail
        assert Allocation.objects.filter(host=host).count() == versions
        assert not Override.objects.filter(ended_at__isnull=True).exists()
    else:
        assert response.status_code == 200, response.content
        kept = Override.objects.get(host=host, ended_at__isnull=True).expires_at
        assert kept == datetime.fromisoformat(text)
        Override.objects.filter(host=host).update(ended_at=timezone.now())


@pytest.mark.parametrize("expires_at", [1_900_000_000, True, ["2100-01-01T00:00:00Z"], {}])
def test_an_expiry_that_is_not_a_string_is_refused(api, operator, job_and_host, expires_at):
    job, host, _ = job_and_host
    response = api.as_user(operator).put(
        override_url(host),
        {"workers": {s: 1 for s in job.stage_names}, "reason": "x", "expires_at": expires_at},
        format="json",
    )
    assert response.status_code == 400 and response.json()["detail"].startswith("expires_at: ")
    assert not Override.objects.exists()
