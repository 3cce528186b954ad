"""Logic on jobs, hosts and allocations that is neither a view nor a model."""

from collections import defaultdict
from collections.abc import Mapping
from statistics import fmean
from typing import NamedTuple

from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from agents.budget import (
    HostBudget,
    StageBudget,
    WorkerCpuMeter,
    allocation_cpu_slots,
    allocation_memory_mb,
    allocation_problems,
    cpu_slots,
    most_workers,
)
from webapp import pubsub

from .models import Allocation, AuditEntry, Host, Job, Stage


def audit(
    actor, action: str, *, job: Job | None = None, host: Host | None = None, **details
) -> None:
    """Record a change a person made."""
    AuditEntry.objects.create(
        actor=actor if getattr(actor, "is_authenticated", False) else None,
        actor_name=getattr(actor, "username", "") or "system",
        action=action,
        job=job or (host.job if host else None),
        host=host,
        details=details,
    )


@transaction.atomic
def register_job(*, user, name: str, stages: list[dict], description: str = "", **tuning) -> Job:
    job = Job.objects.create(name=name, description=description, created_by=user, **tuning)
    Stage.objects.bulk_create(
        Stage(job=job, position=position, **stage) for position, stage in enumerate(stages)
    )
    audit(user, "job.create", job=job, name=name, stages=[s["name"] for s in stages])
    return job


@transaction.atomic
def register_host(
    *, job: Job, user, name: str, cpus: float, memory_mb: float, worker_budget: int | None
) -> tuple[Host, str]:
    """Register a host and its default allocation (one worker per stage). Returns the host and
    its agent token, which is shown once and stored only as a hash."""
    stage_names = job.stage_names
    token = Host.new_token()
    host = Host(
        job=job,
        name=name,
        cpus=cpus,
        memory_mb=memory_mb,
        worker_budget=worker_budget or cpu_slots(cpus, len(stage_names)),
    )
    host.set_token(token)
    host.save()
    create_allocation(host, {stage: 1 for stage in stage_names}, Allocation.Source.DEFAULT)
    audit(user, "host.register", host=host, name=name, cpus=cpus, memory_mb=memory_mb)
    return host, token


def memory_mb_per_worker(host: Host) -> dict[str, float]:
    """Each stage's memory per worker: declared on the stage, else measured by the agent."""
    from webapp.ingestion.models import StageSample

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


def effective_worker_budget(host: Host) -> int:
    """The registered CPU slots, or fewer when the agent reports fewer: the agent knows its
    host (cgroup limits, --worker-budget) and refuses more than it allows."""
    from webapp.ingestion.models import HostSample

    reported = (
        HostSample.objects.filter(host=host, resolution_s=1, worker_budget__isnull=False)
        .order_by("-ts")
        .values_list("worker_budget", flat=True)
        .first()
    )
    return min(host.worker_budget, reported) if reported else host.worker_budget


# Samples read back to measure what a worker costs: a minute at the agent's 1 Hz, of which the
# meter keeps each stage's last few that say something (agents.budget.WorkerCpuMeter).
BUDGET_SAMPLES = 60


class Budget(NamedTuple):
    """A host's budget as agents.budget checks it: the host's and each stage's."""

    host: HostBudget
    stages: list[StageBudget]


def _recent_measurements(host: Host) -> list[tuple[float, list[dict]]]:
    """The host's last raw samples, oldest first: (host CPU percent, the stages' fields)."""
    from webapp.ingestion.models import HostSample, StageSample

    samples = list(
        HostSample.objects.filter(host=host, resolution_s=1)
        .order_by("-ts")
        .values("id", "cpu_percent")[:BUDGET_SAMPLES]
    )
    stages = defaultdict(list)
    rows = StageSample.objects.filter(sample_id__in=[s["id"] for s in samples]).values(
        "sample_id", "stage", "workers", "busy_fraction", "cpu_percent"
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
    return Budget(HostBudget(effective_worker_budget(host), host.memory_mb, host.cpus), stages)


def validate_allocation(
    host: Host, workers: object, budget: Budget | None = None
) -> dict[str, int]:
    """Check an allocation against the job's stages and the host's budget (agents.budget).

    ``budget`` defaults to :func:`host_budget`; a caller that showed a tuner the budget passes
    the same one, so that what the tuner allowed is what is checked. Raises ValidationError with
    every problem found, each saying what is wrong and the limit.
    """
    budget = budget or host_budget(host)
    problems = allocation_problems(workers, budget.stages, budget.host)
    if problems:
        raise ValidationError({"workers": problems})
    assert isinstance(workers, Mapping)
    return {stage.name: workers[stage.name] for stage in budget.stages}


def budget_summary(host: Host) -> dict:
    """The host's budget in its own terms, for the API and the dashboard: CPU slots and what the
    newest allocation takes of them, the CPU the pipeline was measured to use, memory, and each
    stage's CPU slots per worker and most workers."""
    measurements = _recent_measurements(host)
    budget = host_budget(host, measurements)
    newest = latest_allocation(host)
    workers = newest.workers if newest is not None else {}
    taken = allocation_cpu_slots(workers, budget.stages) if newest else None
    memory = allocation_memory_mb(workers, budget.stages) if newest else None
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
        parts.append(
            f"the allocation takes {taken:.1f} of {slots:g} CPU slots"
            + (f" ({waiting})" if waiting else "")
        )
    if memory:
        parts.append(f"memory about {memory:.0f} of {host.memory_mb:.0f} MB")
    else:
        parts.append(f"memory budget {host.memory_mb:.0f} MB")
    return {
        "cpus": host.cpus,
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


def create_allocation(host: Host, workers: dict[str, int], source: str, user=None) -> Allocation:
    """Store the next allocation version of a host and announce it once the transaction commits.

    The host row is locked so that concurrent writers (a tuning step, an override) get
    consecutive versions.
    """
    with transaction.atomic():
        locked = Host.objects.select_for_update().get(pk=host.pk)
        version = locked.allocation_version + 1
        Allocation.objects.filter(host=locked, status=Allocation.Status.PENDING).update(
            status=Allocation.Status.SUPERSEDED
        )
        allocation = Allocation.objects.create(
            host=locked, version=version, workers=workers, source=source, created_by=user
        )
        Host.objects.filter(pk=host.pk).update(allocation_version=version)
        host.allocation_version = version
        transaction.on_commit(lambda: pubsub.publish_allocation(host.pk, version))
    return allocation


def latest_allocation(host: Host) -> Allocation | None:
    return host.allocations.order_by("-version").first()


def record_allocation_status(host: Host, status: Mapping | None) -> None:
    """Apply an agent's report of which version it applied and which it refused."""
    if not status:
        return
    applied = status.get("applied_version")
    now = timezone.now()
    if applied is not None and applied > host.applied_version:
        host.applied_version = applied
        Allocation.objects.filter(host=host, version=applied).update(
            status=Allocation.Status.APPLIED, applied_at=now
        )
        Allocation.objects.filter(
            host=host, version__lt=applied, status=Allocation.Status.PENDING
        ).update(status=Allocation.Status.SUPERSEDED)
    for refusal in status.get("refused") or []:
        Allocation.objects.filter(host=host, version=refusal["version"]).update(
            status=Allocation.Status.REFUSED, refusal_reason=refusal["reason"][:2000]
        )
