"""Fit a version-1 scenario (a job's own twin) to the samples its agent reported.

Samples follow the agent protocol (``docs/agent-protocol.md``): each has ``host``, ``trainer`` and
``stages``. A stage's CPU per busy worker (``cpu_percent`` against ``busy_fraction``, read as
:mod:`agents.budget` reads it) gives the part ``d`` of a worker's time per sample spent on a CPU;
a stage that computes has ``d = 1``, one that waits less than a half. For each stage the capacity
it showed, ``items_per_s / busy_fraction``, is regressed on its workers in log space, after
removing the CPU share where it applies: ``log(r * ((1 - d) + d / share)) = s * log(w) +
log(1e6 / t)``, which gives ``scaling`` (s) and the time per sample ``t``, split into
``us_per_sample = d * t`` and ``wait_us_per_sample = (1 - d) * t``. A stage seen with a single
worker count keeps ``scaling = 1``. Memory per worker is the median of ``rss_mb / workers``. The
consumer's rate is the trainer's throughput in samples where it, not the pipeline, was the
bottleneck (every stage had clear spare capacity); the noise is the spread of the fit.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from agents.budget import WAITING_BELOW, relative_cpu_per_busy_worker
from tuner.actions import MIN_BUSY
from tuner.scenario import scenario_from_dict

# A stage is "clearly not the bottleneck" when its capacity is this far above the throughput.
SPARE_CAPACITY = 1.15


def _cpu_part(samples: list[dict]) -> dict[str, float]:
    """Each stage whose workers wait: the median part of a busy worker's time it used a CPU."""
    seen: dict[str, list[float]] = defaultdict(list)
    for sample in samples:
        relative = relative_cpu_per_busy_worker(
            sample["stages"], sample.get("host", {}).get("cpu_percent")
        )
        for name, value in relative.items():
            seen[name].append(value)
    medians = {name: float(np.median(values)) for name, values in seen.items()}
    return {name: max(d, 1e-3) for name, d in medians.items() if d < WAITING_BELOW}


def fit_scenario(samples: list[dict], name: str = "fitted") -> dict:
    """A version-1 scenario dict fitted to agent-protocol samples (at least one)."""
    usable = [
        s for s in samples if s.get("trainer", {}).get("throughput", 0) > 0 and s.get("stages")
    ]
    if not usable:
        raise ValueError(
            "no usable sample: fitting needs samples with a positive trainer.throughput and "
            "per-stage measurements"
        )
    names = [stage["name"] for stage in usable[0]["stages"]]
    cpus = float(np.median([s["host"]["cpus"] for s in usable]))
    memory_mb = float(np.median([s["host"]["memory_limit_mb"] for s in usable]))
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    memory_per_worker: dict[str, list[float]] = defaultdict(list)
    caps: dict[str, int | None] = {}
    consumer_bound = []
    cpu_part = _cpu_part(usable)
    for sample in usable:
        stages = {stage["name"]: stage for stage in sample["stages"]}
        demand = sum(s["workers"] * cpu_part.get(n, 1.0) for n, s in stages.items())
        share = min(1.0, cpus / max(demand, 1e-9))
        throughput = sample["trainer"]["throughput"]
        capacities = []
        for stage_name, stage in stages.items():
            busy = max(float(stage["busy_fraction"]), MIN_BUSY)
            capacity = max(float(stage["items_per_s"]), 1e-9) / busy
            capacities.append(capacity)
            d = cpu_part.get(stage_name, 1.0)
            unshared = capacity * ((1.0 - d) + d / share)
            points[stage_name].append((math.log(stage["workers"]), math.log(unshared)))
            if stage.get("rss_mb") is not None and stage["workers"] > 0:
                memory_per_worker[stage["name"]].append(stage["rss_mb"] / stage["workers"])
            if stage.get("max_workers") is not None:
                caps[stage["name"]] = int(stage["max_workers"])
        if min(capacities) > SPARE_CAPACITY * throughput:
            consumer_bound.append(throughput)
    fitted_stages = []
    residuals: list[float] = []
    for stage_name in names:
        x, y = (np.array(v) for v in zip(*points[stage_name], strict=False))
        if np.ptp(x) > 1e-9:
            slope, intercept = np.polyfit(x, y, 1)
            scaling = float(np.clip(slope, 0.3, 1.0))
        else:
            scaling = 1.0
        intercept = float(np.median(y - scaling * x))
        residuals.extend(y - scaling * x - intercept)
        per_sample = 1e6 / math.exp(intercept)
        d = cpu_part.get(stage_name, 1.0)
        wait = {"wait_us_per_sample": round((1.0 - d) * per_sample, 4)} if d < 1.0 else {}
        fitted_stages.append(
            {
                "name": stage_name,
                "us_per_sample": round(d * per_sample, 4),
                **wait,
                "max_workers": caps.get(stage_name),
                "scaling": round(scaling, 3),
                "memory_mb_per_worker": round(float(np.median(memory_per_worker[stage_name])), 2)
                if memory_per_worker[stage_name]
                else 0.0,
            }
        )
    noise = float(np.clip(np.std(residuals) if len(residuals) > 1 else 0.02, 0.0, 0.1))
    scenario = {
        "name": name,
        "host": {"cpus": cpus, "memory_gb": round(memory_mb / 1024, 4)},
        "consumer_samples_per_s": round(float(np.median(consumer_bound)), 1)
        if consumer_bound
        else None,
        "stages": fitted_stages,
        "noise": round(noise, 4),
        "events": [],
    }
    scenario_from_dict(scenario)  # the fit must always be a valid version-1 scenario
    return scenario
