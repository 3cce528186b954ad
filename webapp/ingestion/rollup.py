"""Roll-up of one host's raw samples into averaged, coarser samples."""

from collections import defaultdict
from statistics import fmean

from django.db import transaction

from webapp.jobs.models import Host

from .models import HostSample, StageSample
from .services import HOST_SERIES, STAGE_SERIES


@transaction.atomic
def roll_up_host(host: Host, *, raw_before: float, step: int, delete_before: float) -> dict:
    """Replace the host's raw samples older than ``raw_before`` by one sample per ``step``
    seconds (means of every measure; the newest allocation version of the bucket), then delete
    every sample older than ``delete_before``.

    Only whole buckets are rolled up (``raw_before`` is rounded down to a bucket's start), so a
    later pass never makes a second rolled sample for a bucket an earlier pass cut in two.
    """
    raw_before = (raw_before // step) * step
    raw = list(
        HostSample.objects.filter(host=host, resolution_s=1, ts__lt=raw_before)
        .order_by("ts")
        .values(
            "id",
            "seq",
            "ts",
            "allocation_version",
            "device",
            "worker_budget",
            "ranks",
            *HOST_SERIES,
        )  # fmt: skip
    )
    buckets: dict[int, list[dict]] = defaultdict(list)
    for row in raw:
        buckets[int(row["ts"] // step)].append(row)
    stage_rows: dict[int, list[dict]] = defaultdict(list)
    for row in StageSample.objects.filter(sample_id__in=[r["id"] for r in raw]).values(
        "sample_id", "stage", *STAGE_SERIES
    ):
        stage_rows[row["sample_id"]].append(row)
    HostSample.objects.filter(id__in=[r["id"] for r in raw]).delete()
    # The rolled samples in one statement and their stages in another (a statement or two per
    # bucket before: 2,160 for a day's 18 hours of 1 Hz samples, 4 s of a 13 s roll-up).
    groups = list(buckets.values())

    def mean(field, rows):
        values = [r[field] for r in rows if r[field] is not None]
        return fmean(values) if values else None

    rolled_samples = HostSample.objects.bulk_create(
        HostSample(
            host=host,
            seq=min(r["seq"] for r in rows),
            ts=fmean(r["ts"] for r in rows),
            resolution_s=step,
            allocation_version=max((r["allocation_version"] or 0) for r in rows),
            device=rows[-1]["device"],
            worker_budget=rows[-1]["worker_budget"],
            # Each rank's own figures (RankSample) are kept at full resolution only.
            ranks=rows[-1]["ranks"],
            **{field: mean(field, rows) for field in HOST_SERIES},
        )
        for rows in groups
    )
    rolled_stages = []
    for rolled, rows in zip(rolled_samples, groups, strict=True):
        per_stage: dict[str, list[dict]] = defaultdict(list)
        for r in rows:
            for stage_row in stage_rows[r["id"]]:
                per_stage[stage_row["stage"]].append(stage_row)
        rolled_stages += [
            StageSample(
                sample=rolled,
                host=host,
                ts=rolled.ts,
                stage=stage,
                **{
                    f: (
                        round(fmean(s[f] for s in items))
                        if f == "workers"
                        else fmean(s[f] for s in items)
                    )
                    for f in STAGE_SERIES
                },
            )
            for stage, items in per_stage.items()
        ]
    StageSample.objects.bulk_create(rolled_stages, batch_size=5000)
    deleted, _ = HostSample.objects.filter(host=host, ts__lt=delete_before).delete()
    return {"rolled_up": len(raw), "deleted": deleted}
