"""A day of 1 Hz samples from a host with 8 stages, rolled up: the raw window stays at full
resolution, the rest shrinks to one sample a minute, and the tables' sizes are what that
predicts; rolling up again changes nothing."""

import time

import pytest
from django.db import connection
from django.test import override_settings

from webapp.ingestion.models import HostSample, StageSample
from webapp.ingestion.tasks import roll_up_and_expire_samples

pytestmark = pytest.mark.slow
STAGES = [f"stage{i}" for i in range(8)]
DAY_S = 86_400
RAW_S = 6 * 3600
STEP_S = 60


def fill_a_day(host, now: float) -> None:
    """86,400 host samples and 691,200 stage samples. On PostgreSQL the server makes the rows
    (generate_series: 2 statements, seconds, where sending them took minutes on a loaded CI
    host); elsewhere the host rows through the ORM's bulk_create and the stage rows through
    executemany. Both make the same rows."""
    start = int(now) - DAY_S
    if connection.vendor == "postgresql":
        fill_a_day_on_the_server(host, start)
        return
    columns = (
        "sample_id, host_id, ts, stage, workers, items_per_s, busy_fraction, in_queue, "
        "out_queue, queue_capacity, cpu_percent, rss_mb"
    )
    insert = (
        f"INSERT INTO {StageSample._meta.db_table} ({columns}) VALUES ({', '.join(['%s'] * 12)})"
    )
    for chunk in range(0, DAY_S, 3600):
        rows = HostSample.objects.bulk_create(
            HostSample(host=host, seq=i, ts=start + i + 0.5, cpus=8, cpu_percent=50.0,
                       memory_used_mb=1000.0, memory_limit_mb=16384.0, throughput=1000.0 + i % 7,
                       idle_fraction=0.2, allocation_version=1)
            for i in range(chunk, chunk + 3600)
        )  # fmt: skip
        with connection.cursor() as cursor:
            cursor.executemany(insert, [
                (row.pk, host.pk, row.ts, name, 2, 1000.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0)
                for row in rows for name in STAGES
            ])  # fmt: skip


def fill_a_day_on_the_server(host, start: int) -> None:
    hosts, stages = HostSample._meta.db_table, StageSample._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {hosts} (host_id, seq, ts, resolution_s, allocation_version, cpus, "
            "cpu_percent, memory_used_mb, memory_limit_mb, ranks, throughput, idle_fraction, "
            "device) SELECT %s, i, %s + i + 0.5, 1, 1, 8, 50.0, 1000.0, 16384.0, 1, "
            "1000.0 + i %% 7, 0.2, 'cpu' FROM generate_series(0, %s - 1) AS i",
            [host.pk, start, DAY_S],
        )
        cursor.execute(
            f"INSERT INTO {stages} (sample_id, host_id, ts, stage, workers, items_per_s, "
            "busy_fraction, in_queue, out_queue, queue_capacity, cpu_percent, rss_mb) "
            "SELECT h.id, h.host_id, h.ts, s.name, 2, 1000.0, 0.5, 0, 0, 0, 0, 0 "
            f"FROM {hosts} h CROSS JOIN unnest(%s::text[]) AS s(name) WHERE h.host_id = %s",
            [STAGES, host.pk],
        )
        cursor.execute(f"ANALYZE {hosts}; ANALYZE {stages}")


@pytest.mark.django_db(transaction=True)
def test_a_day_of_samples_rolls_up_to_a_bounded_size(make_job, make_host):
    host, _token = make_host(make_job(stages=STAGES))
    now = time.time()
    fill_a_day(host, now)
    assert HostSample.objects.count() == DAY_S
    knobs = {"RAW_RETENTION_S": RAW_S, "ROLLUP_STEP_S": STEP_S, "ROLLUP_RETENTION_S": 30 * DAY_S}
    from django.conf import settings

    with override_settings(INTUNE=settings.INTUNE | knobs):
        started = time.monotonic()
        first = roll_up_and_expire_samples()
        took_s = time.monotonic() - started
        again = roll_up_and_expire_samples()

    raw = HostSample.objects.filter(resolution_s=1).count()
    rolled = HostSample.objects.filter(resolution_s=STEP_S).count()
    # The last RAW_S seconds stay raw, and the rest of the minute the edge falls in (only whole
    # minutes are rolled up); the older 18 hours become one sample a minute. The raw window's
    # edge moved on while the day was written: allow for the seconds since.
    elapsed = time.time() - now
    assert -(elapsed + 1) <= raw - RAW_S <= STEP_S + 1, raw
    # One sample per clock minute: a partial minute at each end of the rolled span adds one.
    minutes = (DAY_S - raw) / STEP_S
    assert minutes <= rolled <= minutes + 2, (rolled, raw)
    assert StageSample.objects.count() == (raw + rolled) * len(STAGES)
    # Every raw sample rolled up once; the second run only takes what aged past the edge since.
    assert first["rolled_up"] + again["rolled_up"] == DAY_S - raw
    assert again["rolled_up"] <= STEP_S + time.time() - now
    print(
        f"a day of 1 Hz samples x 8 stages: {DAY_S} -> {raw + rolled} host rows, "
        f"{DAY_S * 8} -> {StageSample.objects.count()} stage rows; roll-up took {took_s:.1f} s"
    )
