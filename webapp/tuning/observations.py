"""From a window of stored samples to the tuner's Observation (tuner/ knows nothing of Django)."""

from statistics import fmean

from tuner import HostObservation, Observation, StageObservation
from webapp.ingestion.models import HostSample, StageSample
from webapp.ingestion.services import host_budget
from webapp.jobs.models import Host
from webapp.jobs.services import Budget


def fresh_window(host: Host, after_ts: float):
    """Samples newer than ``after_ts`` measured under the allocation the agent has applied, so a
    decision is judged on what its own allocation did, not on the transition before it."""
    return HostSample.objects.filter(
        host=host, ts__gt=after_ts, resolution_s=1, allocation_version=host.applied_version
    ).order_by("ts")


def build_observation(
    host: Host, samples: list[HostSample], budget: Budget | None = None
) -> Observation:
    """Average the window into one Observation, with the host's budget (``host_budget``): the
    tuner is shown the CPU slots each worker takes that the control plane checks against.

    On a host of N local ranks the samples hold the host's totals and the allocation is per
    rank, so the tuner is shown one rank's share: the totals (workers, rates, CPU, memory,
    samples/s) and the host's CPUs, slots and memory divided by N. Its decision is the
    allocation every rank runs; its reward, the log change of throughput, is the log change
    of the host's total samples/s (N does not change within a session's window).

    The observation carries the layout of the allocation the agent applied (the window's): with
    stages fused, each stage of a group reports the group's workers, and the tuner counts them
    once per group, as the budget does.
    """
    stage_specs = {stage.name: stage for stage in host.job.stages.all()}
    budget = budget or host_budget(host)
    ranks = max(1, samples[-1].ranks if samples else budget.host.ranks)
    worker_cpu = {stage.name: stage.worker_cpu for stage in budget.stages}
    rows = StageSample.objects.filter(sample__in=samples).values()
    by_stage: dict[str, list[dict]] = {name: [] for name in stage_specs}
    for row in rows:
        by_stage.setdefault(row["stage"], []).append(row)
    stages = []
    held = 0.0  # MB the workers hold of their own, one rank's
    for name, spec in stage_specs.items():
        measured = by_stage.get(name) or []
        total_workers = measured[-1]["workers"] if measured else ranks
        workers = max(1, round(total_workers / ranks))
        rss = fmean(r["rss_mb"] for r in measured) / ranks if measured else 0.0
        held += rss
        capacity = fmean(r["queue_capacity"] for r in measured) if measured else 0.0
        out_queue = fmean(r["out_queue"] for r in measured) if measured else 0.0
        stages.append(
            StageObservation(
                name=name,
                workers=workers,
                items_per_s=fmean(r["items_per_s"] for r in measured) / ranks if measured else 0.0,
                busy_fraction=fmean(r["busy_fraction"] for r in measured) if measured else 0.0,
                cpu_percent=fmean(r["cpu_percent"] for r in measured) / ranks if measured else None,
                runqueue_percent=(
                    fmean(r["runqueue_percent"] for r in measured) / ranks if measured else 0.0
                ),
                worker_cpu=worker_cpu.get(name, 1.0),
                queue_fill=min(1.0, out_queue / capacity) if capacity else 0.0,
                max_workers=spec.max_workers,
                # Measured 0 is a figure (thread workers, or process workers holding nothing of
                # their own: agents.pipeline counts none of what they share with the trainer),
                # not a stage without one, whose memory the tuner would take from the host's.
                memory_mb_per_worker=spec.memory_mb_per_worker
                or (rss / workers if measured and workers else None),
            )
        )
    used = fmean(s.memory_used_mb for s in samples) / ranks
    return Observation(
        stages=stages,
        host=HostObservation(
            cpus=fmean(s.cpus for s in samples) / ranks,
            cpu_percent=fmean(s.cpu_percent for s in samples),
            memory_limit_mb=min(host.memory_mb, fmean(s.memory_limit_mb for s in samples)) / ranks,
            memory_used_mb=used,
            worker_budget=int(budget.host.cpu_slots / ranks + 1e-9),
            memory_outside_mb=max(0.0, used - held),
        ),
        throughput=fmean(s.throughput for s in samples) / ranks,
        trainer_idle_fraction=fmean(s.idle_fraction for s in samples),
        layout=_applied_layout(host),
    )


def _applied_layout(host: Host) -> list[list[str]] | None:
    return (
        host.allocations.filter(version=host.applied_version)
        .values_list("layout", flat=True)
        .first()
    )


def summarise(observation: Observation, ranks: int = 1) -> dict:
    """The observation as stored with a decision: small, JSON, readable in the dashboard. On a
    multi-rank host it is one rank's share (``build_observation``); ``host_throughput`` is the
    host's total."""
    return {
        "ranks": ranks,
        "host_throughput": round(observation.throughput * ranks, 3),
        "throughput": round(observation.throughput, 3),
        "trainer_idle_fraction": round(observation.trainer_idle_fraction, 4),
        "host": {
            "cpus": observation.host.cpus,
            "cpu_percent": round(observation.host.cpu_percent, 2),
            "memory_used_mb": round(observation.host.memory_used_mb, 1),
            "memory_limit_mb": round(observation.host.memory_limit_mb, 1),
            "worker_budget": observation.host.worker_budget,
        },
        "stages": [
            {
                "name": s.name,
                "workers": s.workers,
                "items_per_s": round(s.items_per_s, 3),
                "busy_fraction": round(s.busy_fraction, 4),
                "queue_fill": round(s.queue_fill, 4),
            }
            for s in observation.stages
        ],
    }
