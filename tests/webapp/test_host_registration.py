"""Hosts: registered under a job, their agent token shown once and stored as a hash."""

import hashlib

from webapp.jobs.models import Allocation, Host


def test_registering_a_host_shows_its_token_once_and_stores_only_a_hash(api, operator, make_job):
    job = make_job(stages=["read", "parse", "transform"])
    client = api.as_user(operator)
    response = client.post(
        f"/api/v1/jobs/{job.pk}/hosts/",
        {"name": "trainer-1", "cpus": 16, "memory_mb": 65536},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    token = body["agent_token"]
    host = Host.objects.get(pk=body["id"])
    assert token not in str(Host.objects.filter(pk=host.pk).values().first())
    assert host.token_hash == hashlib.sha256(token.encode()).hexdigest()
    listed = client.get(f"/api/v1/jobs/{job.pk}/hosts/").json()
    assert "agent_token" not in listed["results"][0]


def test_a_new_host_gets_one_worker_per_stage_and_the_default_budget(api, operator, make_job):
    job = make_job(stages=["read", "parse", "transform"])
    body = (
        api.as_user(operator)
        .post(
            f"/api/v1/jobs/{job.pk}/hosts/",
            {"name": "h", "cpus": 4, "memory_mb": 8192},
            format="json",
        )
        .json()
    )
    assert body["worker_budget"] == 4 + 3
    allocation = Allocation.objects.get(host_id=body["id"])
    assert allocation.workers == {"read": 1, "parse": 1, "transform": 1}
    assert allocation.source == "default" and allocation.version == 1


def test_a_viewer_cannot_register_a_host(api, viewer, make_job):
    job = make_job()
    response = api.as_user(viewer).post(
        f"/api/v1/jobs/{job.pk}/hosts/", {"name": "h", "cpus": 4, "memory_mb": 8192}, format="json"
    )
    assert response.status_code == 403
    assert not Host.objects.exists()


def test_impossible_budgets_are_refused(api, operator, make_job):
    job = make_job()
    response = api.as_user(operator).post(
        f"/api/v1/jobs/{job.pk}/hosts/", {"name": "h", "cpus": -1, "memory_mb": 0}, format="json"
    )
    assert response.status_code == 400
    assert "cpus" in response.json()["detail"] and "memory_mb" in response.json()["detail"]


def test_the_default_budget_of_the_largest_host_is_one_the_schema_allows(api, operator, make_job):
    """Found by schemathesis: 100,000 CPUs (the most allowed) and a stage made a default budget
    of 100,001, above the schema's maximum for ``worker_budget``."""
    from drf_spectacular.generators import SchemaGenerator

    job = make_job(stages=["read", "parse"])
    body = (
        api.as_user(operator)
        .post(
            f"/api/v1/jobs/{job.pk}/hosts/",
            {"name": "h", "cpus": 100_000, "memory_mb": 8192, "ranks": 1024},
            format="json",
        )
        .json()
    )
    schema = SchemaGenerator().get_schema(request=None, public=True)
    field = schema["components"]["schemas"]["HostRegistered"]["properties"]["worker_budget"]
    maximum = next(s["maximum"] for s in field.get("anyOf", [field]) if "maximum" in s)
    assert body["worker_budget"] == 100_000 + 2 * 1024 <= maximum
