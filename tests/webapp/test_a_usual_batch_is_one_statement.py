"""The usual batch is stored by one statement that is its own transaction
(``services.store_usual_batch``): all of it or none of it, committed before it returns, and a
batch stored before in part or in whole is left to ``store_batch`` untouched."""

import threading

import psycopg
import pytest
from django.db import connection

from webapp.ingestion.models import HostSample, StageSample
from webapp.ingestion.services import SequenceConflict, store_batch, store_usual_batch
from webapp.ingestion.validation import validate_batch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement path is PostgreSQL's (CI runs it)")


def validated(job, sample, seqs, ts0=1000.0):
    raw = {"samples": [sample(seq, job.stage_names, ts=ts0 + seq) for seq in seqs]}
    return validate_batch(raw, set(job.stage_names), 600)


def counted_elsewhere(host_ids) -> int:
    """Samples of ``host_ids`` as another connection sees them (committed ones only)."""
    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"] or None, port=settings["PORT"] or None, user=settings["USER"],
        password=settings["PASSWORD"] or None, dbname=settings["NAME"], connect_timeout=10,
    ) as other:  # fmt: skip
        return other.execute(
            "SELECT count(*) FROM ingestion_hostsample WHERE host_id = ANY(%s)", [list(host_ids)]
        ).fetchone()[0]


def test_a_burst_of_batches_is_stored_once_each_and_committed_before_each_answer(
    make_job, make_host, sample
):
    job = make_job()
    # As many at once as a web process has threads (and the pool connections: 16).
    hosts = [make_host(job)[0] for _ in range(12)]
    start, answers, errors = threading.Barrier(len(hosts)), {}, []

    def post(host):
        try:
            batch = validated(job, sample, range(1, 6))
            start.wait(timeout=30)
            answer = store_usual_batch(host, batch)
            # Answered only once committed: another connection sees every sample already.
            seen = counted_elsewhere([host.pk])
            answers[host.pk] = (answer, seen)
        except Exception as exc:  # the assertion below shows what went wrong
            errors.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(h,)) for h in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert all(answer["stored"] == 5 and seen == 5 for answer, seen in answers.values())
    assert len(answers) == len(hosts)
    assert HostSample.objects.filter(host__in=hosts).count() == 5 * len(hosts)
    assert StageSample.objects.filter(host__in=hosts).count() == 5 * len(hosts) * len(
        job.stage_names
    )
    for host in hosts:
        host.refresh_from_db()
        assert host.last_seq == 5 and host.status == "online"


def test_a_resent_batch_is_left_to_store_batch_which_acknowledges_it(job_and_host, sample):
    job, host, _ = job_and_host
    assert store_usual_batch(host, validated(job, sample, [1, 2, 3]))["stored"] == 3
    assert store_usual_batch(host, validated(job, sample, [3, 4])) is None  # 3 is stored
    assert HostSample.objects.filter(host=host).count() == 3  # 4 was not stored either
    answer = store_batch(host, validated(job, sample, [3, 4]))
    assert (answer["stored"], answer["duplicates"]) == (1, 1)


def test_a_reused_sequence_number_stores_nothing_of_its_batch(job_and_host, sample):
    job, host, _ = job_and_host
    store_usual_batch(host, validated(job, sample, [1]))
    reused = validated(job, sample, [1, 2], ts0=2000.0)  # seq 1 again, another moment
    assert store_usual_batch(host, reused) is None
    with pytest.raises(SequenceConflict):
        store_batch(host, reused)
    assert list(HostSample.objects.filter(host=host).values_list("seq", flat=True)) == [1]
    host.refresh_from_db()
    assert host.last_seq == 1


def test_copies_racing_by_the_lean_paths_way_are_stored_once_and_all_acknowledged(
    job_and_host, sample
):
    job, host, _ = job_and_host
    start, answers, errors = threading.Barrier(4), [], []

    def post():
        try:
            batch = validated(job, sample, range(1, 201))
            start.wait(timeout=30)
            answers.append(store_usual_batch(host, batch) or store_batch(host, batch))
        except Exception as exc:  # the assertion below shows what went wrong
            errors.append(repr(exc))
        finally:
            connection.close()

    copies = [threading.Thread(target=post) for _ in range(4)]
    for copy in copies:
        copy.start()
    for copy in copies:
        copy.join(timeout=60)
    assert errors == []
    assert len(answers) == 4
    assert sum(a["stored"] for a in answers) == 200
    assert all(a["stored"] + a["duplicates"] == 200 for a in answers)
    assert HostSample.objects.filter(host=host).count() == 200
    assert StageSample.objects.filter(host=host).count() == 200 * len(job.stage_names)
