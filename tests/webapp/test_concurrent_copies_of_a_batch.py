"""Copies of one batch posted at the same moment (an agent's retry racing its first try) are
stored once, and every copy is acknowledged: the database skips what another copy stored."""

import threading

import pytest
from django.db import connection

from webapp.ingestion.models import HostSample, StageSample
from webapp.ingestion.services import store_batch
from webapp.ingestion.validation import validate_batch


@pytest.mark.django_db(transaction=True)
def test_four_copies_of_a_batch_at_once_store_it_once_and_all_succeed(job_and_host, sample):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite serialises writers; the race needs PostgreSQL (CI runs it)")
    job, host, _ = job_and_host
    raw = {"samples": [sample(i, job.stage_names, ts=1000.0 + i) for i in range(1, 201)]}
    start, answers, errors = threading.Barrier(4), [], []

    def post():
        try:
            start.wait()
            answers.append(store_batch(host, validate_batch(raw, set(job.stage_names), 600)))
        except Exception as exc:  # the assertion below shows what went wrong
            errors.append(repr(exc))
        finally:
            connection.close()

    copies = [threading.Thread(target=post) for _ in range(4)]
    for copy in copies:
        copy.start()
    for copy in copies:
        copy.join(timeout=60)
    assert not any(copy.is_alive() for copy in copies), "a copy of the batch never finished"
    assert errors == []
    assert len(answers) == 4
    assert sum(a["stored"] for a in answers) == 200  # each sample stored by exactly one copy
    assert all(a["stored"] + a["duplicates"] == 200 for a in answers)
    assert HostSample.objects.filter(host=host).count() == 200
    assert StageSample.objects.filter(host=host).count() == 200 * len(job.stage_names)
