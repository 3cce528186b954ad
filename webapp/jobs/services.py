"""Logic on jobs, hosts and allocations that is neither a view nor a model."""

from collections.abc import Mapping
from typing import NamedTuple

from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from agents.budget import (
    HostBudget,
    StageBudget,
    allocation_problems,
    cpu_slots,
    group_budgets,
)
from agents.layout import layout_problem, workers_problem
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
    *,
    job: Job,
    user,
    name: str,
    cpus: float,
    memory_mb: float,
    worker_budget: int | None,
    ranks: int = 1,
) -> tuple[Host, str]:
    """Register a host and its default allocation (one worker per stage, per rank). Returns the
    host and its agent token, which is shown once and stored only as a hash. A host of
    ``ranks`` local ranks has, by default, one CPU slot per stage of each rank's pipeline."""
    stage_names = job.stage_names
    token = Host.new_token()
    host = Host(
        job=job,
        name=name,
        cpus=cpus,
        memory_mb=memory_mb,
        worker_budget=worker_budget or cpu_slots(cpus, len(stage_names), ranks),
        ranks=ranks,
    )
    host.set_token(token)
    host.save()
    create_allocation(host, {stage: 1 for stage in stage_names}, Allocation.Source.DEFAULT)
    audit(user, "host.register", host=host, name=name, cpus=cpus, memory_mb=memory_mb, ranks=ranks)
    return host, token


class Budget(NamedTuple):
    """A host's budget as agents.budget checks it: the host's and each stage's."""

    host: HostBudget
    stages: list[StageBudget]


def validate_allocation(
    host: Host, workers: object, budget: Budget, layout: object = None
) -> dict[str, int]:
    """Check an allocation against the job's stages and the host's budget (agents.budget).

    ``budget`` is the host's, as measured (``webapp.ingestion.services.host_budget``); a
    caller that showed a tuner the budget passes the same one, so that what the tuner allowed
    is what is checked. With a ``layout`` (agents.layout) ``workers`` names its groups, each
    checked as its stages would be together (see ``group_budgets``). Raises ValidationError
    with every problem found, each saying what is wrong and the limit.
    """
    stages = budget.stages
    if layout is not None:
        problem = layout_problem(layout, [s.name for s in budget.stages])
        if problem:
            raise ValidationError({"layout": [problem]})
        problem = workers_problem(layout, workers)
        if problem:
            raise ValidationError({"workers": [problem]})
        stages = group_budgets(layout, budget.stages)
    problems = allocation_problems(workers, stages, budget.host)
    if problems:
        raise ValidationError({"workers": problems})
    assert isinstance(workers, Mapping)
    return {stage.name: workers[stage.name] for stage in stages}


# A host's budget is measured from its stored samples, which the ingestion app owns (and which
# imports this one): it plugs its summary in here when Django starts (IngestionConfig.ready),
# so that imports keep going one way while the hosts API can show the budget.
_budget_summary = None


def provide_budget_summary(summary) -> None:
    """Set the function that summarises a host's budget (the ingestion app's)."""
    global _budget_summary
    _budget_summary = summary


def budget_summary(host: Host) -> dict | None:
    """The host's budget in its own terms (``webapp.ingestion.services.budget_summary``)."""
    return _budget_summary(host) if _budget_summary is not None else None


def create_allocation(
    host: Host, workers: dict[str, int], source: str, user=None, layout: list | None = None
) -> Allocation:
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
            host=locked,
            version=version,
            workers=workers,
            layout=layout,
            source=source,
            created_by=user,
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
