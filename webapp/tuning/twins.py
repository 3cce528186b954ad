"""A host's pipeline twin: fitted (tuner/) from the samples its agent reported, used to pretrain
the host's policy before online tuning and to estimate the best throughput the host allows."""

import logging

from django.utils import timezone

import tuner as tuner_lib
from tuner.optimum import optimum
from tuner.scenario import scenario_from_dict
from webapp.ingestion.models import HostSample, StageSample
from webapp.ingestion.services import STAGE_SERIES
from webapp.jobs.models import Host

log = logging.getLogger(__name__)

# Fewer samples than this say too little about how the stages scale to fit a twin.
MIN_SAMPLES_FOR_TWIN = 30


def protocol_samples(host: Host, limit: int = 1200) -> list[dict]:
    """The host's newest raw samples, back in the agent protocol's shape (what tuner/ reads)."""
    rows = list(HostSample.objects.filter(host=host, resolution_s=1).order_by("-ts")[:limit])
    stages: dict[int, list[dict]] = {}
    for stage in StageSample.objects.filter(sample__in=rows).values():
        stages.setdefault(stage["sample_id"], []).append(
            {
                "name": stage["stage"],
                **{k: stage[k] for k in STAGE_SERIES},
            }
        )
    limits = {s.name: s.max_workers for s in host.job.stages.all()}
    order = {name: i for i, name in enumerate(limits)}
    samples = []
    for row in reversed(rows):
        row_stages = sorted(stages.get(row.pk, []), key=lambda s: order.get(s["name"], 0))
        # A multi-rank host's samples hold its totals; the twin, like the tuner's observation
        # (webapp/tuning/observations.py), is one rank's share of the host.
        n = max(1, row.ranks)
        for stage in row_stages:
            if limits.get(stage["name"]) is not None:
                stage["max_workers"] = limits[stage["name"]]
            if n > 1:
                stage["workers"] = max(1, round(stage["workers"] / n))
                for key in ("items_per_s", "in_queue", "out_queue", "queue_capacity"):
                    stage[key] /= n
                stage["cpu_percent"] /= n
                stage["runqueue_percent"] /= n
                stage["rss_mb"] /= n
        samples.append(
            {
                "seq": row.seq,
                "ts": row.ts,
                "host": {
                    "cpus": row.cpus / n,
                    "cpu_percent": row.cpu_percent,
                    "memory_used_mb": row.memory_used_mb / n,
                    "memory_limit_mb": min(row.memory_limit_mb, host.memory_mb) / n,
                    "worker_budget": host.worker_budget // n,
                },
                "trainer": {"throughput": row.throughput / n, "idle_fraction": row.idle_fraction},
                "stages": row_stages,
            }
        )
    return samples


def fit_host_twin(host: Host) -> dict | None:
    """Fit and store the host's twin (a version-1 scenario) and its estimated best throughput.
    Returns the scenario, or None when there are too few samples yet."""
    samples = protocol_samples(host)
    if len(samples) < MIN_SAMPLES_FOR_TWIN:
        return None
    scenario = tuner_lib.fit_scenario(samples, name=f"{host.job.name}/{host.name}")
    # One rank's share of the host (protocol_samples); the host's best is N times that.
    ranks = max(1, HostSample.objects.filter(host=host).order_by("-ts").first().ranks)
    scenario["host"]["worker_budget"] = host.worker_budget // ranks
    best = optimum(scenario_from_dict(scenario), scenario_from_dict(scenario).host_at(0))
    scenario["estimated_best"] = {
        "throughput": best.throughput * ranks,
        "ranks": ranks,
        "allocation": dict(
            zip([s["name"] for s in scenario["stages"]], best.allocation, strict=True)
        ),
    }
    host.twin = scenario
    host.twin_fitted_at = timezone.now()
    host.save(update_fields=["twin", "twin_fitted_at"])
    log.info(
        "fitted the twin of host %s from %s samples: best about %.0f samples/s",
        host.pk,
        len(samples),
        best.throughput,
    )
    return scenario
