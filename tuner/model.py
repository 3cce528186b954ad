"""The twin's performance model (issue 4): stage rates, memory and throughput of an allocation.

Pure functions of a scenario, a host state and an integer allocation (one entry per stage, in
pipeline order). The twin adds measurement noise on top; the bench's optimum searches over this.

A worker of stage ``i`` spends ``us_i`` of CPU time and ``wait_i`` of waiting (I/O) on each
sample, so while busy it asks for ``demand_i = us_i / (us_i + wait_i)`` of a CPU. The operating
system time-slices the CPUs left to the pipeline, ``C``, among the workers: each gets
``share = min(1, C / sum(w_i * demand_i))`` of what it asks, and takes ``wait_i + us_i / share``
per sample. A stage that only computes (``wait = 0``) thus has ``w ** s * share * 1e6 / us``.

Where the tuners' model is wrong (:mod:`tuner.scenario`'s keys of issue 15): ``w ** s`` is divided
by the Universal Scalability Law's ``1 + serial_fraction (w - 1) + coherency w (w - 1)``; the
memory-bound part of every stage's CPU time stretches by the host's bandwidth slowdown
``max(1, sum(w * memory_bound) / memory_bandwidth)``; and a stage's wait grows to
``wait (1 + wait_growth (w - 1))``; past the CPUs, the host's ``oversubscription`` ``k`` leaves
the pipeline ``C / (1 + k (D / C - 1))`` of its ``C`` CPUs, ``D`` the CPUs its workers ask for.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agents.budget import HostBudget, StageBudget, allocation_problems, worker_cpu
from tuner.scenario import HostState, Scenario, StageSpec


def worker_demand(stage: StageSpec) -> float:
    """The CPUs one busy worker of ``stage`` asks for: its CPU time over its time per sample."""
    return stage.us_per_sample / (stage.us_per_sample + stage.wait_us_per_sample)


def bandwidth_slowdown(scenario: Scenario, allocation: Sequence[int]) -> float:
    """How much the memory-bound part of CPU time stretches: ``max(1, sum(w * memory_bound) /
    memory_bandwidth)`` (1 when the host has no bandwidth limit)."""
    if not scenario.memory_bandwidth:
        return 1.0
    asked = sum(w * s.memory_bound for w, s in zip(allocation, scenario.stages, strict=False))
    return max(1.0, asked / scenario.memory_bandwidth)


def stage_times(scenario: Scenario, allocation: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per stage, a busy worker's CPU time and wait per sample (us) at a whole CPU: the
    bandwidth slowdown and the wait growth of this allocation applied."""
    slowdown = bandwidth_slowdown(scenario, allocation)
    workers = np.asarray(allocation, dtype=float)
    bound = np.array([s.memory_bound for s in scenario.stages])
    growth = np.array([s.wait_growth for s in scenario.stages])
    us = np.array([s.us_per_sample for s in scenario.stages]) * (1.0 - bound + bound * slowdown)
    wait = np.array([s.wait_us_per_sample for s in scenario.stages]) * (
        1.0 + growth * (workers - 1.0)
    )
    return us, wait


def scaling_factor(stage: StageSpec, workers: np.ndarray | float) -> np.ndarray | float:
    """What ``workers`` workers of ``stage`` make of one's rate: ``w ** scaling`` over the
    Universal Scalability Law's ``1 + serial_fraction (w - 1) + coherency w (w - 1)``."""
    w = np.asarray(workers, dtype=float)
    usl = 1.0 + stage.serial_fraction * (w - 1.0) + stage.coherency * w * (w - 1.0)
    return w**stage.scaling / usl


def cpu_share(scenario: Scenario, host: HostState, allocation: Sequence[int]) -> float:
    """Fraction of what it asks each worker gets: ``min(1, C / sum(w * demand))``."""
    us, wait = stage_times(scenario, allocation)
    demand = sum(w * (u / (u + t)) for w, u, t in zip(allocation, us, wait, strict=False))
    if demand <= 0:
        return 1.0
    cpus = host.effective_cpus
    if cpus > 0 and demand > cpus:
        # Oversubscribed: time slicing itself costs CPU time. Still falls as workers grow, so
        # tuner.optimum's search stays exact.
        cpus /= 1.0 + scenario.oversubscription * (demand / cpus - 1.0)
    return min(1.0, cpus / demand)


def stage_rates(scenario: Scenario, host: HostState, allocation: Sequence[int]) -> np.ndarray:
    """Samples/s each stage can produce: ``w ** scaling * 1e6 / (wait + us / share)``, with
    the model-is-wrong terms of :func:`scaling_factor` and :func:`stage_times`."""
    share = cpu_share(scenario, host, allocation)
    workers = np.asarray(allocation, dtype=float)
    if share <= 0:
        return np.zeros(len(workers))
    us, wait = stage_times(scenario, allocation)
    scaling = np.array([s.scaling for s in scenario.stages])
    serial = np.array([s.serial_fraction for s in scenario.stages])
    coherency = np.array([s.coherency for s in scenario.stages])
    usl = 1.0 + serial * (workers - 1.0) + coherency * workers * (workers - 1.0)
    return workers**scaling / usl * 1e6 / (wait + us / share)


def memory_mb(scenario: Scenario, allocation: Sequence[int]) -> float:
    """Resident memory of the pipeline's workers, in MB."""
    return float(
        sum(w * s.memory_mb_per_worker for w, s in zip(allocation, scenario.stages, strict=False))
    )


def out_of_memory(scenario: Scenario, host: HostState, allocation: Sequence[int]) -> bool:
    """Whether the allocation needs more memory than the host's limit."""
    return memory_mb(scenario, allocation) > host.memory_limit_mb


def throughput(scenario: Scenario, host: HostState, allocation: Sequence[int]) -> float:
    """Noise-free pipeline throughput in samples/s; 0 when the allocation runs out of memory."""
    if out_of_memory(scenario, host, allocation):
        return 0.0
    value = float(stage_rates(scenario, host, allocation).min())
    if host.consumer_samples_per_s is not None:
        value = min(value, host.consumer_samples_per_s)
    return value


def stage_budgets(scenario: Scenario) -> list[StageBudget]:
    """Each stage as the budget (:mod:`agents.budget`) counts it once an agent measured it
    running unhindered: CPU slots per worker from its demand, and its ``max_workers``."""
    return [
        StageBudget(s.name, max_workers=s.max_workers, worker_cpu=worker_cpu(worker_demand(s)))
        for s in scenario.stages
    ]


def check_allocation(scenario: Scenario, host: HostState, allocation: Sequence[int]) -> str | None:
    """Why an agent would refuse this allocation (bounds and CPU slots), or ``None``.

    Memory is not checked here: an allocation over the memory limit is applied and runs out of
    memory, which is what the twin models.
    """
    if len(allocation) != len(scenario.stages):
        return (
            f"allocation has {len(allocation)} stages but the pipeline has {len(scenario.stages)}"
        )
    workers = {
        s.name: int(w) if int(w) == w else w
        for s, w in zip(scenario.stages, allocation, strict=True)
    }
    problems = allocation_problems(
        workers, stage_budgets(scenario), HostBudget(host.worker_budget, cpus=host.cpus)
    )
    return problems[0] if problems else None
