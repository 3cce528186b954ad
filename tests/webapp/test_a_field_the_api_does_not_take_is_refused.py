"""A field the people's API does not take is a 400 naming it and the fields it takes, and
nothing changes. DRF dropped such fields without a word: a typo (``"expire_at"``) made an
override that never expired, ``"cpu"`` a host with the default CPUs. A field the API answers
but does not take (read-only: ``id``, ``created_at``) is still ignored, so what a GET answered
may be sent back. The agents' batches are not concerned: the protocol ignores fields it does
not know, so that a newer agent may send more (docs/agent-protocol.md)."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webapp.jobs.models import Allocation, AuditEntry, Host, Job
from webapp.tuning.models import Override, TuningSession

KNOWN = {
    "job": {"name", "description", "stages", "tuner", "decision_interval_s", "tuning_options"},
    "host": {"name", "cpus", "memory_mb", "worker_budget", "ranks"},
    "override": {"workers", "layout", "reason", "expires_at"},
    "tuning": {"tuner", "max_steps", "hosts"},
}
UNKNOWN = st.text(min_size=1, max_size=80).filter(
    lambda key: key not in set().union(*KNOWN.values()) | {"id", "created_at", "stage"}
)


def rows() -> tuple:
    return (
        Job.objects.count(),
        Host.objects.count(),
        Allocation.objects.count(),
        Override.objects.count(),
        TuningSession.objects.count(),
        AuditEntry.objects.count(),
    )


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(endpoint=st.sampled_from(sorted(KNOWN)), key=UNKNOWN, nested=st.booleans())
def test_a_field_the_api_does_not_take_is_refused_naming_it(
    api, operator, job_and_host, endpoint, key, nested
):
    job, host, _ = job_and_host
    client = api.as_user(operator)
    if endpoint == "job":
        body = {"name": "typo", "stages": [{"name": "read"}], "tuner": "static"}
        method, path = client.post, "/api/v1/jobs/"
    elif endpoint == "host":
        body = {"name": "typo", "cpus": 4, "memory_mb": 4096}
        method, path = client.post, f"/api/v1/jobs/{job.pk}/hosts/"
    elif endpoint == "override":
        body = {"workers": {s: 1 for s in job.stage_names}, "reason": "x"}
        method, path = client.put, f"/api/v1/hosts/{host.pk}/override/"
    else:
        body = {"tuner": "static"}
        method, path = client.post, f"/api/v1/jobs/{job.pk}/tuning/"
    if nested and endpoint == "job":
        body["stages"][0][key] = 1
    else:
        body[key] = 1
    before = rows()
    response = method(path, body, format="json")
    assert response.status_code == 400, response.content
    detail = response.json()["detail"]
    assert f"{key[:64]}: unknown field; this takes " in detail, detail
    assert rows() == before


def test_what_a_get_answered_may_be_sent_back(api, operator, make_job):
    job = make_job()
    client = api.as_user(operator)
    answered = client.get(f"/api/v1/jobs/{job.pk}/").json()
    answered["description"] = "sent back"
    response = client.patch(f"/api/v1/jobs/{job.pk}/", answered, format="json")
    assert response.status_code == 200, response.content
    assert Job.objects.get(pk=job.pk).description == "sent back"


@pytest.mark.parametrize("typo", ["expire_at", "expires", "expiresAt"])
def test_an_override_with_a_misspelt_expiry_is_not_made_forever(api, operator, job_and_host, typo):
    job, host, _ = job_and_host
    body = {"workers": {s: 1 for s in job.stage_names}, "reason": "x", typo: "2100-01-01T00:00:00Z"}
    response = api.as_user(operator).put(f"/api/v1/hosts/{host.pk}/override/", body, format="json")
    assert response.status_code == 400 and response.json()["detail"].startswith(f"{typo}: ")
    assert not Override.objects.exists()


def test_a_token_request_with_a_field_it_does_not_take_is_refused(api, operator):
    operator.set_password("a-long-password-1")
    operator.save()
    body = {"username": operator.username, "password": "a-long-password-1", "otp": "123456"}
    response = api.post("/api/v1/auth/token/", body, format="json")
    assert response.status_code == 400
    assert response.json()["detail"] == "otp: unknown field; this takes password, username"
    del body["otp"]
    assert api.post("/api/v1/auth/token/", body, format="json").status_code == 200
