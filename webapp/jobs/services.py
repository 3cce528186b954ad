"""Logic on jobs, hosts and allocations that is neither a view nor a model."""

import math
from collections.abc import Mapping

from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

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


def default_worker_budget(cpus: float, stage_count: int) -> int:
    """CPUs plus one slot per stage: the OS time-slices the CPUs among the workers, as it does
    for tf.data's parallelism, so even a small host has a choice to make."""
    return max(stage_count, math.floor(cpus) + stage_count)


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
        worker_budget=worker_budget or default_worker_budget(cpus, len(stage_names)),
    )
    host.set_token(token)
    host.save()
    create_allocation(host, {stage: 1 for stage in stage_names}, Allocation.Source.DEFAULT)
    audit(user, "host.register", host=host, name=name, cpus=cpus, memory_mb=memory_mb)
    return host, token


def validate_allocation(
    host: Host,
    workers: object,
    *,
    worker_budget: int,
    memory_mb_per_worker: Mapping[str, float],
) -> dict[str, int]:
    """Check an allocation against the job's stages and the host's budgets: ``worker_budget``
    workers in all, and each stage's ``memory_mb_per_worker`` within the host's memory (what
    the host's agent reported: ``webapp.ingestion.services.effective_worker_budget`` and
    ``memory_mb_per_worker``).

    Raises ValidationError with every problem found, each saying what is wrong and the limit.
    """
    if not isinstance(workers, Mapping):
        raise ValidationError({"workers": "must be an object of stage name -> worker count"})
    stages = {stage.name: stage for stage in host.job.stages.all()}
    errors = []
    unknown = sorted(set(workers) - set(stages))
    if unknown:
        errors.append(f"unknown stage(s) {unknown}; this job's stages are {list(stages)}")
    missing = [name for name in stages if name not in workers]
    if missing:
        errors.append(f"missing stage(s) {missing}: give every stage a worker count")
    clean: dict[str, int] = {}
    for name, count in workers.items():
        if name not in stages:
            continue
        if isinstance(count, bool) or not isinstance(count, int):
            errors.append(f"stage '{name}': worker count must be an integer, got {count!r}")
            continue
        if count < 1:
            errors.append(f"stage '{name}' asks for {count} workers; every stage needs at least 1")
            continue
        limit = stages[name].max_workers
        if limit is not None and count > limit:
            errors.append(f"stage '{name}' asks for {count} workers but allows at most {limit}")
            continue
        clean[name] = count
    if not errors:
        total = sum(clean.values())
        budget = worker_budget
        if total > budget:
            errors.append(
                f"the allocation asks for {total} workers but the host budget is "
                f"{budget} worker slots ({host.cpus:g} CPUs)"
            )
        needed = sum(clean[name] * memory_mb_per_worker.get(name, 0.0) for name in clean)
        if needed > host.memory_mb:
            errors.append(
                f"the allocation needs about {needed:.0f} MB of memory but the host's budget is "
                f"{host.memory_mb:.0f} MB"
            )
    if errors:
        raise ValidationError({"workers": errors})
    return {name: clean[name] for name in stages}


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
