"""The exact optimum of a scenario at a step, for the bench only (no tuner sees it).

Why the search is exact: for a throughput ``t``, call ``need(t)`` the smallest allocation whose
every stage reaches ``t``. It is found by iteration: start at a whole CPU per worker, give each
stage the fewest workers that reach ``t`` at that CPU share, recompute the share those workers
leave, and repeat. Workers only grow, and any allocation reaching ``t`` stays above every
iterate (its share is no larger), so the fixed point is below it stage by stage: it takes no
more CPU slots and no more memory. ``t`` is thus reachable within the budget exactly when
``need(t)`` fits, which is monotone in ``t``; a bisection on ``t``, snapped at each step to the
throughput ``need(t)`` really reaches, finds the best.

The model-is-wrong terms keep this exact: the bandwidth slowdown, like the share, only worsens as
workers grow, and a stage whose rate peaks (coherency) has its fewest workers for ``t`` before
the peak, found by a search over its workers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agents.budget import HostBudget, allocation_cpu_slots, most_workers
from tuner.model import (
    bandwidth_slowdown,
    check_allocation,
    cpu_share,
    out_of_memory,
    scaling_factor,
    stage_budgets,
    throughput,
)
from tuner.scenario import HostState, Scenario, StageSpec

# Relative width at which the bisection stops; far below any noise the twin adds.
_PRECISION = 1e-12


@dataclass(frozen=True)
class Optimum:
    """The best throughput reachable at a step, and one allocation that reaches it."""

    throughput: float
    allocation: tuple[int, ...]


def _uppers(scenario: Scenario, host: HostState) -> list[int]:
    """Each stage's most workers with every other stage at one (bounds and CPU slots)."""
    stages = stage_budgets(scenario)
    budget = HostBudget(host.worker_budget)
    return [most_workers(stage, stages, budget) for stage in stages]


def _rates(stage: StageSpec, share: float, slowdown: float, upper: int):
    """The rate of ``stage`` at 1..``upper`` workers, at ``share`` and ``slowdown``."""
    w = np.arange(1, upper + 1, dtype=float)
    us = stage.us_per_sample * (1.0 - stage.memory_bound + stage.memory_bound * slowdown)
    wait = stage.wait_us_per_sample * (1.0 + stage.wait_growth * (w - 1.0))
    return scaling_factor(stage, w) * 1e6 / (wait + us / share)


def _need(
    stage: StageSpec, level: float, share: float, upper: int, slowdown: float = 1.0
) -> int | None:
    """Fewest workers giving ``stage`` a rate of at least ``level`` at ``share`` (and the
    bandwidth ``slowdown``), or None above ``upper``."""
    if stage.model_wrong:
        # No closed form: the rate may peak (coherency) and the wait grows; search the workers.
        # The fewest that reach ``level`` lie before the peak, where the rate grows with them.
        reached = np.flatnonzero(_rates(stage, share, slowdown, upper) >= level * (1 - 1e-12))
        return int(reached[0]) + 1 if reached.size else None
    per_sample = stage.wait_us_per_sample + stage.us_per_sample / share
    target = level * per_sample / 1e6  # workers ** scaling must reach this

    def enough(w: int) -> bool:
        return w**stage.scaling >= target * (1 - 1e-12)

    guess = max(1, math.ceil(target ** (1.0 / stage.scaling) - 1e-9))
    if guess > upper and not enough(upper):
        return None
    guess = min(guess, upper)
    while guess > 1 and enough(guess - 1):
        guess -= 1
    while not enough(guess):
        guess += 1
    return guess if guess <= upper else None


def _least(
    scenario: Scenario,
    host: HostState,
    level: float,
    uppers: list[int],
    fits: Callable[[tuple[int, ...]], bool],
) -> tuple[int, ...] | None:
    """The smallest allocation whose every stage reaches ``level``, or None when it breaks a
    bound or does not ``fit`` (CPU slots, memory): the iterates only grow, so none would."""
    share, slowdown = 1.0, 1.0
    allocation: tuple[int, ...] | None = None
    while True:
        needs = [
            _need(s, level, share, u, slowdown)
            for s, u in zip(scenario.stages, uppers, strict=True)
        ]
        if any(n is None for n in needs):
            return None
        current = tuple(int(n) for n in needs if n is not None)
        if not fits(current):
            return None
        if current == allocation:
            return current
        allocation = current
        share = cpu_share(scenario, host, allocation)
        slowdown = bandwidth_slowdown(scenario, allocation)
        if share <= 0:
            return None


def optimum(scenario: Scenario, host: HostState) -> Optimum:
    """The best feasible integer allocation (caps, CPU slots, memory) and its throughput."""
    n = len(scenario.stages)
    ones = tuple(1 for _ in range(n))
    best = Optimum(0.0, ones)
    if check_allocation(scenario, host, ones) is not None or out_of_memory(scenario, host, ones):
        return best
    uppers = _uppers(scenario, host)
    budgets = stage_budgets(scenario)
    names = scenario.stage_names

    def fits(allocation: tuple[int, ...]) -> bool:
        slots = allocation_cpu_slots(dict(zip(names, allocation, strict=True)), budgets)
        return slots <= host.worker_budget + 1e-9 and not out_of_memory(scenario, host, allocation)

    low = throughput(scenario, host, ones)
    if low <= 0:
        return best
    best = Optimum(low, ones)
    high = min(
        float(_rates(s, 1.0, 1.0, u).max())
        if s.model_wrong
        else u**s.scaling * 1e6 / (s.wait_us_per_sample + s.us_per_sample)
        for s, u in zip(scenario.stages, uppers, strict=True)
    )
    if host.consumer_samples_per_s is not None:
        high = min(high, host.consumer_samples_per_s)
    # Probe the top first: a consumer-bound scenario reaches it.
    probe = high
    while high > low * (1 + _PRECISION):
        allocation = _least(scenario, host, probe, uppers, fits)
        if allocation is not None:
            value = throughput(scenario, host, allocation)
            if value > best.throughput * (1 + 1e-12) or (
                value >= best.throughput * (1 - 1e-12) and sum(allocation) < sum(best.allocation)
            ):
                best = Optimum(value, allocation)
            low = max(low, value, probe)
            if low >= high:
                break
        else:
            high = probe
        probe = math.sqrt(low * high)
    return best


def brute_force_optimum(scenario: Scenario, host: HostState) -> Optimum:
    """The optimum by trying every allocation; for tests on small scenarios only."""
    ranges = [range(1, upper + 1) for upper in _uppers(scenario, host)]
    best = Optimum(0.0, tuple(1 for _ in scenario.stages))
    for allocation in itertools.product(*ranges):
        if check_allocation(scenario, host, allocation) is not None:
            continue
        value = throughput(scenario, host, allocation)
        if value > best.throughput * (1 + 1e-12):
            best = Optimum(value, tuple(allocation))
    return best
