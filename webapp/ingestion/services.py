"""Storing agents' metric batches and reading their series back, downsampled."""

import functools
import logging
from collections import defaultdict
from statistics import fmean

from django.db import connection, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from agents.budget import (
    HostBudget,
    StageBudget,
    WorkerCpuMeter,
    allocation_cpu_slots,
    allocation_memory_mb,
    most_workers,
)
from webapp.jobs.models import Host
from webapp.jobs.services import (
    Budget,
    group_budgets,
    latest_allocation,
    record_allocation_status,
)

from .inserts import BatchInsertPostgres, GroupBatch, MultiRowInsert, WholeBatchRefused
from .models import HostSample, RankSample, StageSample

log = logging.getLogger(__name__)

HOST_FIELDS = (
    "allocation_version", "cpus", "cpu_percent", "memory_used_mb", "memory_limit_mb",
    "worker_budget", "throughput", "idle_fraction", "step_ms", "wait_ms", "device", "per_cpu_percent",
    "ranks",
)  # fmt: skip


_stage_names: dict[tuple, frozenset[str]] = {}


def stage_names_of(job) -> frozenset[str]:
    """The job's stage names, cached per process: they cannot change once a host is registered
    (and only registered hosts send metrics), and every batch needs them."""
    key = (job.pk, job.created_at)
    names = _stage_names.get(key)
    if names is None:
        if len(_stage_names) > 10_000:
            _stage_names.clear()
        names = _stage_names[key] = frozenset(job.stage_names)
    return names


class SequenceConflict(ValueError):
    """A sequence number already stored for this host names a different sample."""


# A stage sample's measurements: what is stored, and the series read back.
STAGE_SERIES = (
    "workers", "items_per_s", "busy_fraction", "in_queue", "out_queue", "queue_capacity",
    "cpu_percent", "runqueue_percent", "rss_mb",
)  # fmt: skip


@functools.cache
def _inserts() -> tuple[MultiRowInsert, MultiRowInsert]:
    """The two statements of a batch (built once per process, on first use)."""
    samples = MultiRowInsert(
        HostSample,
        ["host_id", "seq", "ts", "resolution_s", *HOST_FIELDS],
        skip_conflicts_on=["host_id", "seq"],
        returning=["id", "seq"],
    )
    stages = MultiRowInsert(StageSample, ["sample_id", "host_id", "ts", "stage", *STAGE_SERIES])
    return samples, stages


@functools.cache
def _batch_insert_postgres() -> BatchInsertPostgres:
    return BatchInsertPostgres(
        HostSample, ["seq", "ts", *HOST_FIELDS], StageSample, ["stage", *STAGE_SERIES], Host
    )  # fmt: skip


def _group_batch(host: Host, batch: dict) -> GroupBatch:
    """What a validated batch's statement stores and updates its host with."""
    status = batch["allocation_status"]
    return GroupBatch(
        host.pk,
        batch["samples"],
        status["applied_version"] if status else None,
        batch["dropped_samples"],
    )


def _insert_on_postgres(host: Host, batch: dict, *, whole: bool = False) -> list[tuple]:
    """A validated batch's samples, stage rows and host update in one statement."""
    stored = _group_batch(host, batch)
    return _batch_insert_postgres().run(
        stored.host_id,
        stored.samples,
        now=timezone.now(),
        status=Host.Status.ONLINE,
        applied_version=stored.applied_version,
        dropped=stored.dropped,
        whole=whole,
    )


def _status_changes(host: Host, status: dict | None) -> bool:
    """Whether a batch's allocation status is news to record: a newer version applied, or a
    refusal (rare: once per new allocation)."""
    return bool(
        status and ((status["applied_version"] or 0) > host.applied_version or status["refused"])
    )


def _log_dropped(host: Host, batch: dict) -> None:
    if batch["dropped_samples"]:
        log.warning(
            "host %s dropped %s samples while the control plane was away",
            host.pk,
            batch["dropped_samples"],
        )


def store_usual_batch(host: Host, batch: dict) -> dict | None:
    """Store a validated batch as ``store_batch`` does, in ONE statement that is its own
    transaction (no BEGIN and COMMIT round trips around it), when it is the usual one: on
    PostgreSQL, outside a transaction, no allocation status to record, no rank rows, and none
    of its samples stored before. Returns None, having stored nothing, when it is not: then
    ``store_batch`` stores it (and tells a resend from a reused sequence number).

    Why: a fleet in step posts hundreds of batches in the same instant, and the BEGIN and
    COMMIT round trips around the statement were a fifth of the web process's CPU to store one
    (0.97 against 0.76 ms a batch of 5 samples x 8 stages, in process, PostgreSQL, load 14 on
    2 cores; benchmarks/burst_cpu.py has the whole request)."""
    if connection.in_atomic_block or not is_usual_batch(host, batch):
        return None
    try:
        _insert_on_postgres(host, batch, whole=True)
    except WholeBatchRefused:
        return None
    return _stored_usual(host, batch)


def is_usual_batch(host: Host, batch: dict) -> bool:
    """Whether ``store_usual_batch`` (or ``store_usual_batches_together``) may store this
    validated batch by its one statement: on PostgreSQL, samples, no allocation status to
    record, no rank rows. (That none of its samples was stored before, the statement finds.)"""
    samples = batch["samples"]
    return (
        connection.vendor == "postgresql"
        and bool(samples)
        and not _status_changes(host, batch["allocation_status"])
        and not any(s.get("rank_rows") for s in samples)
    )


def _stored_usual(host: Host, batch: dict) -> dict:
    _log_dropped(host, batch)
    return {
        "stored": len(batch["samples"]),
        "duplicates": 0,
        "latest_allocation_version": host.allocation_version,
    }


def store_usual_batches_together(batches: list[tuple[Host, dict]]) -> list[dict] | None:
    """Store usual batches (``is_usual_batch``) of several hosts in ONE statement, which is its
    own transaction: each batch's answer (as ``store_usual_batch``'s), all of them stored and
    committed when this returns. None, having stored nothing, when any of them is not stored
    whole (a sample stored before: a resend, a reused sequence number, a copy racing it; or a
    sequence number twice in the group) or the database refuses one: then each is stored on its
    own (``store_usual_batch`` or ``store_batch``), which tells those cases apart. Database
    errors other than that refusal propagate, nothing stored.

    Why: a fleet in step posts hundreds of batches in the same instant; a commit per batch cost
    PostgreSQL about a quarter of its CPU for them, and the web process a third of its Python
    to store them (``python -m benchmarks.group_commit_pg``), and a statement per batch in one
    transaction still cost each batch a round trip and a run of the statement's plan
    (docs/benchmarks.md, "One statement a group"). The web process gathers the batches that
    arrive together (webapp/agent_asgi.py) and stores them here."""
    if connection.in_atomic_block:
        return None
    group = [_group_batch(host, batch) for host, batch in batches]
    try:
        _batch_insert_postgres().run_group(group, now=timezone.now(), status=Host.Status.ONLINE)
    except WholeBatchRefused:
        return None
    return [_stored_usual(host, batch) for host, batch in batches]


@transaction.atomic
def store_batch(host: Host, batch: dict, *, generic: bool = False) -> dict:
    """Store a validated batch, all or nothing; samples already stored are acknowledged, not
    stored again (a concurrent copy of the same batch included: the database skips what the
    other stored first). On PostgreSQL the samples, their stage rows and the host's update are
    one statement (inserts.BatchInsertPostgres); ``generic`` takes the multi-row INSERTs and
    ORM update every database runs (SQLite; the benchmark's comparison)."""
    # Few round trips on purpose: a fleet posts hundreds of batches a second. The samples go
    # in with an INSERT that skips sequence numbers already stored; only when it skipped
    # some (a resent batch: rare) are those read back, to tell a resend from a reuse.
    samples = batch["samples"]
    status = batch["allocation_status"]
    if _status_changes(host, status):
        # Rare (once per new allocation): lock the host so concurrent reports apply in order.
        record_allocation_status(Host.objects.select_for_update().get(pk=host.pk), status)
    lean = connection.vendor == "postgresql" and not generic
    if lean:
        # The samples, their stage rows and the host's update in one statement; the dropped
        # samples after, once it is known whether this batch was stored before (below).
        inserted = dict(
            (seq, pk) for pk, seq in _insert_on_postgres(host, {**batch, "dropped_samples": 0})
        )
    else:
        insert_samples, _ = _inserts()
        inserted = dict(
            (seq, pk)
            for pk, seq in insert_samples.run(
                {"host_id": host.pk, "resolution_s": 1, **s} for s in samples
            )
        )
    fresh = [s for s in samples if s["seq"] in inserted]
    skipped = [s for s in samples if s["seq"] not in inserted]
    if skipped:
        stored_ts = dict(
            HostSample.objects.filter(host=host, seq__in=[s["seq"] for s in skipped]).values_list(
                "seq", "ts"
            )
        )
        for sample in skipped:
            previous_ts = stored_ts.get(sample["seq"])
            if previous_ts is not None and abs(previous_ts - sample["ts"]) > 1e-3:
                # The place first, as a 400's: the agent may drop that sample and resend the
                # rest (docs/agent-protocol.md), rather than lose the whole batch.
                place = next(i for i, s in enumerate(samples) if s is sample)
                raise SequenceConflict(
                    f"samples[{place}].seq: sequence number {sample['seq']} was already used by "
                    f"this host for a sample at ts={previous_ts}; sequence numbers must never be "
                    "reused (keep them increasing across restarts)"
                )
    if not lean:
        _inserts()[1].run(
            {"sample_id": inserted[s["seq"]], "host_id": host.pk, "ts": s["ts"], **stage}
            for s in fresh
            for stage in s["stages"]
        )
    rank_rows = [
        RankSample(sample_id=inserted[s["seq"]], host_id=host.pk, ts=s["ts"], **row)
        for s in fresh
        for row in s.get("rank_rows", ())
    ]
    if rank_rows:  # multi-rank hosts only: each rank's trainer (DDP waits for the slowest)
        RankSample.objects.bulk_create(rank_rows)
    # A resent batch (its answer was lost) carries the same dropped_samples as when it was
    # stored: counted again, every resend added them again ("resending a batch after a timeout
    # is always safe", docs/agent-protocol.md). They were dropped before the batch's oldest
    # sample, so they are counted with that sample: once, when it is stored.
    dropped = batch["dropped_samples"]
    if samples and min(s["seq"] for s in samples) not in inserted:
        dropped = 0
    batch = {**batch, "dropped_samples": dropped}
    _log_dropped(host, batch)
    if not lean:
        _update_host(host, batch)
    elif dropped:
        Host.objects.filter(pk=host.pk).update(dropped_samples=F("dropped_samples") + dropped)
    return {
        "stored": len(fresh),
        "duplicates": len(samples) - len(fresh),
        "latest_allocation_version": host.allocation_version,
    }


def _update_host(host: Host, batch: dict) -> None:
    """The host's update after a batch (the generic path; the lean one does it in SQL)."""
    samples, status = batch["samples"], batch["allocation_status"]
    updates = {"last_seen": timezone.now(), "status": Host.Status.ONLINE}
    if samples:
        updates["last_seq"] = Greatest(
            Coalesce(F("last_seq"), Value(-1)), Value(max(s["seq"] for s in samples))
        )
    if status and status["applied_version"] is not None:
        updates["applied_version"] = Greatest(
            F("applied_version"), Value(status["applied_version"])
        )
    if batch["dropped_samples"]:
        updates["dropped_samples"] = F("dropped_samples") + batch["dropped_samples"]
    Host.objects.filter(pk=host.pk).update(**updates)


def memory_mb_per_worker(host: Host) -> dict[str, float]:
    """Each stage's memory per worker: declared on the stage, else measured by the agent."""
    per_worker = {}
    for stage in host.job.stages.all():
        if stage.memory_mb_per_worker:
            per_worker[stage.name] = stage.memory_mb_per_worker
    latest = (
        StageSample.objects.filter(host=host)
        .order_by("-ts")
        .values("stage", "rss_mb", "workers")[: max(1, host.job.stages.count())]
    )
    for row in latest:
        if row["stage"] not in per_worker and row["workers"] and row["rss_mb"]:
            per_worker[row["stage"]] = row["rss_mb"] / row["workers"]
    return per_worker


def host_ranks(host: Host) -> int:
    """The host's local ranks: what its agent reported last, else what it was registered with."""
    reported = (
        HostSample.objects.filter(host=host, resolution_s=1)
        .order_by("-ts")
        .values_list("ranks", flat=True)
        .first()
    )
    return reported or host.ranks


def effective_worker_budget(host: Host) -> int:
    """The registered budget, or less when the agent reports a smaller one: the agent knows its
    host (cgroup limits, --worker-budget) and refuses more than it allows."""
    reported = (
        HostSample.objects.filter(host=host, resolution_s=1, worker_budget__isnull=False)
        .order_by("-ts")
        .values_list("worker_budget", flat=True)
        .first()
    )
    return min(host.worker_budget, reported) if reported else host.worker_budget


HOST_SERIES = (
    "throughput",
    "idle_fraction",
    "cpu_percent",
    "cpus",
    "memory_used_mb",
    "memory_limit_mb",
    "step_ms",
    "wait_ms",
)


def choose_step(since: float, until: float, requested: float | None, max_points: int) -> float:
    """The bucket width: the one asked for, widened until the range fits in ``max_points``."""
    span = max(until - since, 1.0)
    step = max(requested or 1.0, span / max_points, 1.0)
    return float(step)


def series(host: Host, since: float, until: float, step: float) -> dict:
    """The host's and each stage's series between two instants, averaged in buckets of ``step``
    seconds by the database, so an answer holds at most about ``(until - since) / step`` points."""
    from django.db.models import Avg, Max
    from django.db.models.functions import Floor

    bucket = Floor(F("ts") / step)
    host_rows = (
        HostSample.objects.filter(host=host, ts__gte=since, ts__lte=until)
        .annotate(bucket=bucket)
        .values("bucket")
        .annotate(
            ts=Avg("ts"),
            allocation_version=Max("allocation_version"),
            **{f: Avg(f) for f in HOST_SERIES},
        )
        .order_by("bucket")
    )
    host_series: dict[str, list] = {"ts": [], "allocation_version": []} | {
        f: [] for f in HOST_SERIES
    }
    for row in host_rows:
        for key in host_series:
            host_series[key].append(row[key])
    stage_rows = (
        StageSample.objects.filter(host=host, ts__gte=since, ts__lte=until)
        .annotate(bucket=bucket)
        .values("stage", "bucket")
        .annotate(mean_ts=Avg("ts"), **{f: Avg(f) for f in STAGE_SERIES})
        .order_by("stage", "bucket")
    )
    order = host.job.stage_names
    stages: dict[str, dict[str, list]] = {
        name: {"ts": []} | {f: [] for f in STAGE_SERIES} for name in order
    }
    for row in stage_rows:
        target = stages.setdefault(row["stage"], {"ts": []} | {f: [] for f in STAGE_SERIES})
        target["ts"].append(row["mean_ts"])
        for key in STAGE_SERIES:
            target[key].append(row[key])
    ranks, slowest = rank_series(host, since, until, step)
    return {
        "host": host.pk,
        "since": since,
        "until": until,
        "step": step,
        "series": host_series,
        "stages": stages,
        "ranks": ranks,
        "slowest_rank": slowest,
        "rank_workers": rank_workers(host, since, until),
    }


def rank_workers(host: Host, since: float, until: float) -> dict[str, dict[str, int]]:
    """Each local rank's newest workers per stage in the range (multi-rank hosts; empty
    otherwise): the host agent splits the allocation among its ranks by their measured need,
    so the ranks' shares may differ (agents.budget.split_across_ranks)."""
    from django.db.models import Max

    in_range = RankSample.objects.filter(host=host, ts__gte=since, ts__lte=until).exclude(
        workers=None
    )
    last = in_range.values("rank").annotate(ts=Max("ts")).values_list("rank", "ts")
    newest: dict[str, dict[str, int]] = {}
    for rank, ts in last:
        row = in_range.filter(rank=rank, ts=ts).values("workers").first()
        if row is not None:
            newest[str(rank)] = row["workers"]
    return dict(sorted(newest.items(), key=lambda item: int(item[0])))


RANK_SERIES = ("throughput", "idle_fraction", "step_ms", "wait_ms")


def rank_series(host: Host, since: float, until: float, step: float) -> tuple[dict, int | None]:
    """Each local rank's trainer series (multi-rank hosts; empty otherwise), averaged in buckets
    of ``step`` seconds, and the slowest rank over the range: the one with the least mean
    throughput, which DDP waits for (``None`` with fewer than two ranks)."""
    from django.db.models import Avg
    from django.db.models.functions import Floor

    rows = (
        RankSample.objects.filter(host=host, ts__gte=since, ts__lte=until)
        .annotate(bucket=Floor(F("ts") / step))
        .values("rank", "bucket")
        .annotate(mean_ts=Avg("ts"), **{f: Avg(f) for f in RANK_SERIES})
        .order_by("rank", "bucket")
    )
    ranks: dict[str, dict[str, list]] = {}
    for row in rows:
        target = ranks.setdefault(str(row["rank"]), {"ts": []} | {f: [] for f in RANK_SERIES})
        target["ts"].append(row["mean_ts"])
        for key in RANK_SERIES:
            target[key].append(row[key])
    if len(ranks) < 2:
        return ranks, None
    mean = {rank: fmean(s["throughput"]) for rank, s in ranks.items()}
    return ranks, int(min(mean, key=lambda rank: (mean[rank], int(rank))))


# Samples read back to measure what a worker costs: a minute at the agent's 1 Hz, of which the
# meter keeps each stage's last few that say something (agents.budget.WorkerCpuMeter).
BUDGET_SAMPLES = 60


def _recent_measurements(host: Host) -> list[tuple[float, list[dict]]]:
    """The host's last raw samples, oldest first: (host CPU percent, the stages' fields)."""
    samples = list(
        HostSample.objects.filter(host=host, resolution_s=1)
        .order_by("-ts")
        .values("id", "cpu_percent")[:BUDGET_SAMPLES]
    )
    stages = defaultdict(list)
    rows = StageSample.objects.filter(sample_id__in=[s["id"] for s in samples]).values(
        "sample_id", "stage", "workers", "busy_fraction", "cpu_percent", "runqueue_percent"
    )
    for row in rows:
        stages[row["sample_id"]].append({**row, "name": row["stage"]})
    return [(s["cpu_percent"], stages[s["id"]]) for s in reversed(samples)]


def host_budget(host: Host, measurements: list | None = None) -> Budget:
    """The host's budget: its CPU slots (effective_worker_budget), its registered memory, and
    each stage's bound, CPU slots per worker (measured from the agent's samples, one until
    measured) and memory per worker."""
    if measurements is None:
        measurements = _recent_measurements(host)
    meter = WorkerCpuMeter()
    for host_cpu_percent, stages in measurements:
        meter.update(stages, host_cpu_percent)
    worker_cpu = meter.worker_cpu()
    memory = memory_mb_per_worker(host)
    stages = [
        StageBudget(
            stage.name,
            max_workers=stage.max_workers,
            worker_cpu=worker_cpu.get(stage.name, 1.0),
            memory_mb_per_worker=memory.get(stage.name),
        )
        for stage in host.job.stages.all()
    ]
    return Budget(
        HostBudget(effective_worker_budget(host), host.memory_mb, host.cpus, host_ranks(host)),
        stages,
    )


def budget_summary(host: Host) -> dict:
    """The host's budget in its own terms, for the API and the dashboard: CPU slots and what the
    newest allocation takes of them, the CPU the pipeline was measured to use, memory, and each
    stage's CPU slots per worker and most workers."""
    measurements = _recent_measurements(host)
    budget = host_budget(host, measurements)
    newest = latest_allocation(host)
    workers = newest.workers if newest is not None else {}
    # A fused allocation names its groups: count them as the check of the allocation does.
    stages = group_budgets(newest.layout, budget.stages) if newest and newest.layout else None
    # The allocation is per rank; every rank runs it.
    ranks = budget.host.ranks
    taken = ranks * allocation_cpu_slots(workers, stages or budget.stages) if newest else None
    memory = ranks * allocation_memory_mb(workers, stages or budget.stages) if newest else None
    recent = measurements[-10:]
    cpu_used = (
        fmean(sum(s["cpu_percent"] for s in stages) / 100 for _, stages in recent)
        if recent
        else None
    )
    slots = budget.host.cpu_slots
    parts = []
    if cpu_used is not None:
        parts.append(f"CPU {cpu_used:.1f} of {host.cpus:g} used by the pipeline")
    if taken is not None:
        waiting = ", ".join(
            f"{s.name} waits: {s.worker_cpu:.2f} of a slot per worker"
            for s in budget.stages
            if s.waits
        )
        per_rank = f" ({ranks} ranks x {taken / ranks:.1f})" if ranks > 1 else ""
        parts.append(
            f"the allocation takes {taken:.1f}{per_rank} of {slots:g} CPU slots"
            + (f" ({waiting})" if waiting else "")
        )
    if memory:
        parts.append(f"memory about {memory:.0f} of {host.memory_mb:.0f} MB")
    else:
        parts.append(f"memory budget {host.memory_mb:.0f} MB")
    return {
        "cpus": host.cpus,
        "ranks": ranks,
        "cpu_slots": slots,
        "cpu_slots_taken": None if taken is None else round(taken, 3),
        "cpu_used": None if cpu_used is None else round(cpu_used, 3),
        "memory_mb": host.memory_mb,
        "memory_estimated_mb": None if memory is None else round(memory, 1),
        "stages": [
            {
                "name": s.name,
                "worker_cpu": round(s.worker_cpu, 4),
                "waits": s.waits,
                "most_workers": most_workers(s, budget.stages, budget.host),
            }
            for s in budget.stages
        ],
        "summary": "; ".join(parts),
    }
