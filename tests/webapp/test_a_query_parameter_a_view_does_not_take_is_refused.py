"""A query parameter a view does not take is a 400 naming it and the ones it takes; what each
view takes is what the OpenAPI schema documents (webapp/query_parameters.py). Before, DRF
ignored it: ``?sesion=3`` on a host's decisions answered every session's, and ``?x=1`` on an
agent's batch stored it."""

import json
import re

import pytest
from django.urls import resolve
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webapp.ingestion.models import HostSample
from webapp.query_parameters import ALWAYS, KnownQueryParameters

METHODS = ("get", "post", "put", "patch", "delete")


def test_each_view_takes_the_query_parameters_its_schema_documents():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    checked = 0
    for path, operations in schema["paths"].items():
        match = resolve(re.sub(r"\{[^}]+\}", "1", path))
        cls = getattr(match.func, "cls", None)
        if cls is None or not issubclass(cls, KnownQueryParameters):
            continue
        for method in METHODS:
            if method not in operations:
                continue
            view = cls()
            actions = getattr(match.func, "actions", None)
            if actions:
                view.action = actions[method]
            documented = {
                p["name"] for p in operations[method].get("parameters", []) if p["in"] == "query"
            }
            taken = view.taken_query_parameters(method) - ALWAYS
            assert taken == documented, (path, method, taken, documented)
            checked += 1
    assert checked >= 15


NAMES = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1, max_size=40
).filter(
    lambda n: (
        n not in {"format", "since", "until", "step", "session", "limit", "offset", "job", "host"}
    )
)


@pytest.mark.django_db
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=NAMES,
    endpoint=st.sampled_from(["decisions", "jobs", "metrics", "audit", "batch", "overview"]),
)
def test_a_query_parameter_a_view_does_not_take_is_refused_naming_it(
    api, operator, job_and_host, sample, name, endpoint
):
    job, host, token = job_and_host
    if endpoint == "batch":
        stored = HostSample.objects.count()
        api.credentials()  # an earlier example's person's token would be sent instead
        response = api.post(
            f"/api/v1/hosts/{host.pk}/metrics/",
            data=json.dumps({"samples": [sample(1, job.stage_names)]}),
            content_type="application/json",
            QUERY_STRING=f"{_quote(name)}=1",
            HTTP_AUTHORIZATION=f"Agent {token}",
        )
        assert HostSample.objects.count() == stored
    else:
        path = {
            "decisions": f"/api/v1/hosts/{host.pk}/decisions/",
            "jobs": "/api/v1/jobs/",
            "metrics": f"/api/v1/hosts/{host.pk}/metrics/",
            "audit": "/api/v1/audit/",
            "overview": f"/dashboard/api/hosts/{host.pk}/overview/",
        }[endpoint]
        response = api.as_user(operator).get(path, {name: "1"})
    assert response.status_code == 400, response.content
    detail = response.json()["detail"]
    assert detail.startswith(f"{name[:64]}: unknown query parameter; this takes "), detail


def _quote(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


@pytest.mark.django_db
def test_a_misspelt_session_filter_is_refused_not_answered_with_every_session(
    api, operator, job_and_host
):
    _, host, _ = job_and_host
    response = api.as_user(operator).get(f"/api/v1/hosts/{host.pk}/decisions/", {"sesion": 3})
    assert response.status_code == 400
    assert (
        response.json()["detail"]
        == "sesion: unknown query parameter; this takes limit, offset, session"
    )
