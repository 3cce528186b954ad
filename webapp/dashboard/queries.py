"""Read-only queries behind the dashboard: job summaries, sparklines, allocation history and the
twin's estimate of the best throughput a host allows. Nothing here writes."""

import logging
import time
from collections import defaultdict

from django.db.models import Avg, F
from django.db.models.functions import Floor

from agents.budget import most_workers
from webapp.ingestion.models import HostSample
from webapp.ingestion.services import host_budget
from webapp.jobs.models import Allocation, Host, Job
from webapp.tuning.models import Override, TuningSession

log = logging.getLogger(__name__)

# The home page's sparkline: the last 15 minutes in 10-second buckets.
SPARKLINE_SPAN_S = 900.0
SPARKLINE_STEP_S = 10.0
# A host's "current" figures are the mean of its samples over this many seconds.
CURRENT_WINDOW_S = 30.0
ALLOCATION_HISTORY_LIMIT = 2000
RUNNING = (TuningSession.Status.RUNNING, TuningSession.Status.PRETRAINING)


def current_figures(host_ids: list[int], now: float | None = None) -> dict[int, dict]:
    """Each host's mean throughput and idle fraction over the last ``CURRENT_WINDOW_S``."""
    now = time.time() if now is None else now
    rows = (
        HostSample.objects.filter(host_id__in=host_ids, ts__gte=now - CURRENT_WINDOW_S)
        .values("host_id")
        .annotate(throughput=Avg("throughput"), idle_fraction=Avg("idle_fraction"))
    )
    return {row["host_id"]: row for row in rows}


def job_sparklines(job_ids: list[int], now: float | None = None) -> dict[int, dict]:
    """Each job's end-to-end throughput (summed over its hosts) in buckets over the last
    ``SPARKLINE_SPAN_S``: ``{job_id: {"ts": [...], "throughput": [...]}}``."""
    now = time.time() if now is None else now
    rows = (
        HostSample.objects.filter(host__job_id__in=job_ids, ts__gte=now - SPARKLINE_SPAN_S)
        .annotate(bucket=Floor(F("ts") / SPARKLINE_STEP_S))
        .values("host__job_id", "host_id", "bucket")
        .annotate(throughput=Avg("throughput"))
    )
    per_job: dict[int, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for row in rows:
        per_job[row["host__job_id"]][row["bucket"]] += row["throughput"]
    return {
        job_id: {
            "ts": [bucket * SPARKLINE_STEP_S for bucket in sorted(buckets)],
            "throughput": [buckets[b] for b in sorted(buckets)],
        }
        for job_id, buckets in per_job.items()
    }


def jobs_summary(now: float | None = None) -> list[dict]:
    """One row per job for the home page: hosts by state, current throughput and idle time,
    tuning state and a sparkline."""
    now = time.time() if now is None else now
    jobs = list(Job.objects.prefetch_related("hosts", "sessions").order_by("name"))
    hosts = [host for job in jobs for host in job.hosts.all()]
    figures = current_figures([h.pk for h in hosts], now)
    sparklines = job_sparklines([j.pk for j in jobs], now)
    overrides = overridden_hosts(hosts)
    summary = []
    for job in jobs:
        job_hosts = list(job.hosts.all())
        states = [h.state for h in job_hosts]
        reporting = [figures[h.pk] for h in job_hosts if h.pk in figures]
        running = [s for s in job.sessions.all() if s.status in RUNNING]
        overridden = sum(1 for h in job_hosts if h.pk in overrides)
        summary.append(
            {
                "id": job.pk,
                "name": job.name,
                "tuner": job.tuner,
                "hosts_total": len(job_hosts),
                "hosts_online": states.count("online"),
                "hosts_offline": states.count("offline"),
                "hosts_new": states.count("new"),
                # Hosts feed one trainer each, so the job's throughput is the sum over hosts.
                "throughput": sum(r["throughput"] for r in reporting) if reporting else None,
                "idle_fraction": (
                    sum(r["idle_fraction"] for r in reporting) / len(reporting)
                    if reporting
                    else None
                ),
                "tuning": "running" if running else "stopped",
                "tuning_sessions": len(running),
                "overrides": overridden,
                "sparkline": sparklines.get(job.pk, {"ts": [], "throughput": []}),
            }
        )
    return summary


def overridden_hosts(hosts: list[Host]) -> set[int]:
    """Ids of the hosts among these on which a person's override holds now."""
    return set(
        Override.objects.filter(host__in=hosts, ended_at__isnull=True)
        .exclude(expires_at__lte=_now_dt())
        .values_list("host_id", flat=True)
    )


def allocation_history(host: Host, since: float | None = None) -> list[dict]:
    """The host's allocation versions, oldest first, from the one in force at ``since`` on
    (so that a chart starting at ``since`` knows the allocation it starts with)."""
    allocations = Allocation.objects.filter(host=host).select_related("created_by")
    if since is not None:
        from datetime import UTC, datetime

        since_dt = datetime.fromtimestamp(since, tz=UTC)
        in_force = allocations.filter(created_at__lt=since_dt).order_by("-version").first()
        allocations = allocations.filter(created_at__gte=since_dt)
        if in_force is not None:
            allocations = allocations | Allocation.objects.filter(pk=in_force.pk)
    newest = list(allocations.order_by("-version")[:ALLOCATION_HISTORY_LIMIT])
    return [
        {
            "version": a.version,
            "workers": a.workers,  # keyed by group ("read+parse") when it has a layout
            "layout": a.layout,
            "source": a.source,
            "status": a.status,
            "refusal_reason": a.refusal_reason,
            "created_by": a.created_by.username if a.created_by else None,
            "created_at": a.created_at.timestamp(),
            "applied_at": a.applied_at.timestamp() if a.applied_at else None,
        }
        for a in reversed(newest)
    ]


def twin_estimate(host: Host) -> dict:
    """The twin's best throughput for this host and the allocation reaching it, or why there
    is none. The twin is the scenario fitted from the host's own samples (tuner.fit)."""
    fitted_at = host.twin_fitted_at.timestamp() if host.twin_fitted_at else None
    if not host.twin:
        return {
            "best_throughput": None,
            "allocation": None,
            "fitted_at": None,
            "reason": "no twin fitted for this host yet",
        }
    from tuner.optimum import optimum
    from tuner.scenario import ScenarioError, scenario_from_dict

    try:
        scenario = scenario_from_dict(host.twin)
        best = optimum(scenario, scenario.host_at(0))
    except (ScenarioError, KeyError, TypeError, ValueError) as exc:
        log.warning("host %s: its twin cannot be read: %s", host.pk, exc)
        return {
            "best_throughput": None,
            "allocation": None,
            "fitted_at": fitted_at,
            "reason": f"the host's twin cannot be read: {exc}",
        }
    return {
        "best_throughput": best.throughput,
        "allocation": dict(zip(scenario.stage_names, best.allocation, strict=True)),
        "fitted_at": fitted_at,
        "reason": None,
    }


def stage_limits(host: Host) -> list[dict]:
    """Each stage's bounds for the override form: at least 1 worker, at most what the host's
    budget (agents.budget) leaves once every other stage has its one worker."""
    budget = host_budget(host)
    declared = {stage.name: stage.memory_mb_per_worker for stage in host.job.stages.all()}
    return [
        {
            "name": stage.name,
            "min": 1,
            "max": most_workers(stage, budget.stages, budget.host),
            "max_workers": stage.max_workers,
            "memory_mb_per_worker": declared.get(stage.name),
            "worker_cpu": round(stage.worker_cpu, 4),
        }
        for stage in budget.stages
    ]


def _now_dt():
    from django.utils import timezone

    return timezone.now()
