"""A host's answer is read from one moment of the database: its row and its newest allocation
never mix the moments before and after an agent's report (seen in CI: allocation 2 "applied"
beside the host's applied_version 1, read one query apart while the report committed)."""

import threading

import pytest
from django.db import connection, connections

from webapp.jobs.models import Allocation, Host
from webapp.snapshot import snapshot


def commit_from_another_connection(host_id: int) -> None:
    """What an agent's report commits: the allocation applied and the host's version, at once
    (another thread, so another database connection)."""

    def report():
        try:
            from django.db import transaction

            with transaction.atomic():
                Allocation.objects.filter(host_id=host_id, version=1).update(
                    status=Allocation.Status.APPLIED
                )
                Host.objects.filter(pk=host_id).update(applied_version=1)
        finally:
            connections.close_all()

    thread = threading.Thread(target=report)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()


@pytest.mark.django_db(transaction=True)
def test_queries_in_a_snapshot_see_one_moment(make_job, make_host):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite's transactions already see one moment; the race is PostgreSQL's")
    host, _ = make_host(make_job())
    assert Allocation.objects.get(host=host, version=1).status != Allocation.Status.APPLIED
    with snapshot():
        before = Host.objects.get(pk=host.pk).applied_version
        commit_from_another_connection(host.pk)
        status = Allocation.objects.get(host=host, version=1).status
    assert (before, status) == (0, Allocation.Status.PENDING), "one moment: the one before"
    # Outside a snapshot the same two reads mix the moments (what the host's answer did).
    assert Allocation.objects.get(host=host, version=1).status == Allocation.Status.APPLIED
    assert Host.objects.get(pk=host.pk).applied_version == 1


@pytest.mark.django_db(transaction=True)
def test_the_host_answer_is_read_in_a_snapshot(api, operator, make_job, make_host):
    host, _ = make_host(make_job())
    answer = api.as_user(operator).get(f"/api/v1/hosts/{host.pk}/")
    assert answer.status_code == 200, answer.content
    assert answer.json()["applied_version"] == 0
    assert answer.json()["allocation"]["version"] == 1
