"""A transactional test (``django_db(transaction=True)``) leaves every table empty for the next,
whether a table held a few rows (emptied with DELETE) or many (TRUNCATE), and with rows that
reference each other across the two (tests/conftest.py, ``_emptying_statement``)."""

import pytest
from django.apps import apps
from django.db import connection

from tests.conftest import FEW_ROWS

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_test_fills_a_large_table_and_small_ones(make_job, make_host):
    from webapp.ingestion.models import HostSample

    host, _token = make_host(make_job())
    HostSample.objects.bulk_create(
        HostSample(host=host, seq=i, ts=1.0e9 + i, cpus=8, cpu_percent=50.0, memory_used_mb=1.0,
                   memory_limit_mb=2.0, throughput=1.0, idle_fraction=0.2)
        for i in range(FEW_ROWS + 500)
    )  # fmt: skip
    assert HostSample.objects.count() > FEW_ROWS


def test_the_next_test_finds_every_table_empty():
    # Rows that the flush's post_migrate makes again (content types, permissions) aside.
    remade = {"django_content_type", "auth_permission"}
    with connection.cursor() as cursor:
        left = {}
        for model in apps.get_models(include_auto_created=True):
            table = model._meta.db_table
            if table in remade or not model._meta.managed:
                continue
            cursor.execute(f'SELECT count(*) FROM "{table}"')
            if count := cursor.fetchone()[0]:
                left[table] = count
    assert left == {}, f"rows left by the test before: {left}"
