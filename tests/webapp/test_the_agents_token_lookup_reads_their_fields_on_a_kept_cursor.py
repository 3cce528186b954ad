"""The token lookup of the agents' lean paths (``host_by_token_hash(..., agent_fields=True)``)
reads only the fields those paths use, and any other field still reads as stored; its prepared
statements run on one cursor kept per database connection, replaced with the connection."""

import json

import pytest
from django.db import connection

from webapp.ingestion.inserts import prepared_cursor
from webapp.jobs.models import Host, hash_agent_token
from webapp.permissions import AGENT_HOST_FIELDS, AGENT_JOB_FIELDS, host_by_token_hash

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_agents_fields_are_read_and_the_others_as_stored(make_job, make_host):
    job = make_job()
    host, token = make_host(job)
    Host.objects.filter(pk=host.pk).update(
        allocation_version=7, applied_version=6, twin={"version": 1, "stages": ["a"]}
    )
    full = host_by_token_hash(hash_agent_token(token))
    lean = host_by_token_hash(hash_agent_token(token), agent_fields=True)
    assert lean.get_deferred_fields() == {
        f.attname for f in Host._meta.concrete_fields if f.attname not in AGENT_HOST_FIELDS
    }
    for name in AGENT_HOST_FIELDS:
        assert getattr(lean, name) == getattr(full, name)
    assert (lean.allocation_version, lean.applied_version) == (7, 6)
    assert lean.job.created_at == full.job.created_at == job.created_at
    assert set(AGENT_JOB_FIELDS) < {f.attname for f in type(job)._meta.concrete_fields}
    # A deferred field is read by a query of its own, as stored.
    assert lean.twin == full.twin == {"version": 1, "stages": ["a"]}
    assert (lean.cpus, lean.name, lean.job.name) == (full.cpus, full.name, job.name)
    assert host_by_token_hash(hash_agent_token(token + "x"), agent_fields=True) is None


def test_one_cursor_is_kept_per_connection_and_replaced_with_it(make_job, make_host):
    job = make_job()
    host, token = make_host(job)
    with prepared_cursor() as first:
        pass
    with prepared_cursor() as again:
        assert again is first
    assert host_by_token_hash(hash_agent_token(token), agent_fields=True).pk == host.pk
    connection.close()  # as the lean paths do when a kept connection failed
    with prepared_cursor() as replaced:
        assert replaced is not first
        assert replaced.connection is connection.connection
    assert host_by_token_hash(hash_agent_token(token), agent_fields=True).pk == host.pk


def test_the_lean_paths_read_no_deferred_field(make_job, make_host, sample, monkeypatch):
    """A deferred field read costs a query of its own: the usual batch and re-arm read none."""
    from webapp.ingestion.api.lean import LeanBatchPost
    from webapp.jobs.api.lean import LeanAllocationPoll
    from webapp.jobs.models import Job

    job = make_job()
    host, token = make_host(job)
    loads = []
    for model in (Host, Job):
        original = model.refresh_from_db

        def spy(self, *args, _original=original, **kwargs):
            loads.append((type(self).__name__, kwargs.get("fields")))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(model, "refresh_from_db", spy)
    headers = {
        b"host": b"127.0.0.1:8000",
        b"accept": b"*/*",
        b"authorization": f"Agent {token}".encode(),
    }
    body = json.dumps({"samples": [sample(1, job.stage_names, ts=1.0e9)]}).encode()
    post = {**headers, b"content-type": b"application/json"}
    assert LeanBatchPost()(host.pk, "http", post, b"", body)[0] == 200
    assert LeanAllocationPoll()(host.pk, "http", headers, b"after=1&wait=30", b"") == (1, 30.0)
    assert loads == []
    connection.close()  # the lean paths keep their connection; the test's flush needs it free
