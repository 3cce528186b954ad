"""The pipeline's layout as a decision: which neighbouring stages run fused in one worker.

A stage of its own gives the tuner one lever per step, but every item then crosses a queue
(pickled, piped, unpickled) between each pair of stages, and more processes share the cores.
Fused, a worker runs the steps back to back: no hand-off between them, fewer processes, but one
lever for all, the lowest ``max_workers`` of its steps, and the memory of all of them per worker.

The model here takes :mod:`tuner.model`'s stages (cost, ceiling, scaling, waits, memory) but
shares the CPUs work-conservingly: a worker blocked on a queue leaves its CPU to the others (the
twin's rule, every worker always runnable, would make a cheap stage's idle worker cost a busy
stage its share, and so overstate what fusing gains). It adds the two costs a layout changes:

- ``handoff_us``: CPU time per item per queue crossing, paid by the group that takes the item
  (every group pays one; the last pays ``consumer_us`` more, the crossing to the trainer, which
  every layout pays alike);
- ``switch_penalty``: the time-slicing of many processes on few cores. With ``P`` workers on
  ``C`` CPUs the pipeline keeps ``C / (1 + switch_penalty * max(0, P - C) / C)`` of them: each
  extra runnable process per core costs context switches and cache refills.

Calibrated on the real DLRM pipeline (docs/benchmarks.md, 1 and 2 cores: staged 0.84 and 0.80
of ideal, halves 0.87 and 0.83, fused 0.92 and 0.89): ``handoff_us`` is 3.5% of the total work
per crossing, ``consumer_us`` 5%, ``switch_penalty`` 0.03. :func:`dlrm_scenario` is that twin.

:func:`choose_layout` is the decision: from per-stage costs (as the pipeline measures them,
each function of a fused group timed on its own) and the hand-off cost (a group's CPU per item
less its functions' time), it predicts each layout's best allocation and keeps the layout it
runs unless another is predicted ``margin`` better.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tuner.model import memory_mb, scaling_factor
from tuner.scenario import HostState, Scenario, StageSpec

Span = tuple[int, int]  # stages [start, end) in pipeline order, run fused


@dataclass(frozen=True)
class LayoutCosts:
    """What a layout's hand-offs cost (see the module's docs)."""

    handoff_us: float  # CPU per item per queue crossing, on the taking side
    consumer_us: float = 0.0  # CPU per item of the crossing to the trainer (every layout)
    switch_penalty: float = 0.03  # capacity lost per extra runnable process per core


def all_layouts(n: int) -> list[list[Span]]:
    """Every layout of ``n`` stages: each gap between neighbours cut or not (2 ** (n - 1))."""
    layouts = []
    for cuts in itertools.product([False, True], repeat=max(n - 1, 0)):
        spans, start = [], 0
        for gap, cut in enumerate(cuts, start=1):
            if cut:
                spans.append((start, gap))
                start = gap
        layouts.append([*spans, (start, n)])
    return layouts


def fixed_layouts(n: int) -> dict[str, list[Span]]:
    """The hand-chosen layouts: ``staged`` (each stage alone), ``halves``, ``fused``."""
    half = (n + 1) // 2
    return {
        "staged": [(i, i + 1) for i in range(n)],
        "halves": [(0, half), (half, n)] if n > 1 else [(0, n)],
        "fused": [(0, n)],
    }


def layout_groups(names: Sequence[str], spans: Sequence[Span]) -> list[str]:
    """The stage names a layout runs: ``["read+parse", "transform+collate"]``."""
    return ["+".join(names[i:j]) for i, j in spans]


def spans_of(names: Sequence[str], groups: Sequence[str]) -> list[Span]:
    """The spans of a layout written as group names (the inverse of :func:`layout_groups`)."""
    spans, start = [], 0
    for group in groups:
        length = len(group.split("+"))
        if list(names[start : start + length]) != group.split("+"):
            raise ValueError(f"group {group!r} is not the next stages of {list(names)}")
        spans.append((start, start + length))
        start += length
    if start != len(names):
        raise ValueError(f"the groups {list(groups)} leave stages of {list(names)} out")
    return spans


def group_stage(stages: Sequence[StageSpec], costs: LayoutCosts, last: bool) -> StageSpec:
    """One fused group as a stage of :mod:`tuner.model`: its steps' times summed, plus one
    hand-off (and the consumer's, for the last group); the lowest ceiling; memory summed."""
    us = sum(s.us_per_sample for s in stages)
    ceilings = [s.max_workers for s in stages if s.max_workers is not None]
    return StageSpec(
        name="+".join(s.name for s in stages),
        us_per_sample=us + costs.handoff_us + (costs.consumer_us if last else 0.0),
        max_workers=min(ceilings) if ceilings else None,
        scaling=sum(s.scaling * s.us_per_sample for s in stages) / us if us else 1.0,
        memory_mb_per_worker=sum(s.memory_mb_per_worker for s in stages),
        wait_us_per_sample=sum(s.wait_us_per_sample for s in stages),
    )


def grouped(scenario: Scenario, spans: Sequence[Span], costs: LayoutCosts) -> Scenario:
    """The scenario as the layout ``spans`` runs it: one stage per group."""
    n = len(scenario.stages)
    stages = tuple(group_stage(scenario.stages[i:j], costs, j == n) for i, j in spans)
    return replace(scenario, stages=stages, worker_budget=None)


def layout_throughput(
    scenario: Scenario,
    host: HostState,
    spans: Sequence[Span],
    allocation: Sequence[int],
    costs: LayoutCosts,
) -> float:
    """Samples/s of ``scenario`` run in layout ``spans`` with ``allocation`` (one count per
    group). Work-conserving: a worker blocked on a queue leaves its CPU to the others, so the
    pipeline makes ``min(C' / sum(us_g), min_g w_g ** s_g / (wait_g + us_g))`` samples per
    microsecond, ``C'`` the CPUs less the time-slicing (see the module's docs); 0 out of memory,
    and at most the consumer's rate."""
    model = grouped(scenario, spans, costs)
    cpus = host.effective_cpus
    processes = sum(allocation)
    slicing = 1.0 + costs.switch_penalty * max(0.0, processes - cpus) / max(cpus, 1e-9)
    if memory_mb(model, allocation) > host.memory_limit_mb:
        return 0.0
    work = sum(stage.us_per_sample for stage in model.stages)
    value = (cpus / slicing) * 1e6 / work if work > 0 else math.inf
    for stage, workers in zip(model.stages, allocation, strict=True):
        per_worker = stage.us_per_sample + stage.wait_us_per_sample
        if per_worker > 0:
            value = min(value, float(scaling_factor(stage, workers)) * 1e6 / per_worker)
    if host.consumer_samples_per_s is not None:
        value = min(value, host.consumer_samples_per_s)
    return float(value)


def best_allocation(
    scenario: Scenario,
    host: HostState,
    spans: Sequence[Span],
    costs: LayoutCosts,
    max_total: int | None = None,
) -> tuple[tuple[int, ...], float]:
    """The best allocation of a layout, by climbing: from one worker per group, add one to
    the slowest group while that loses nothing (at most ``max_total`` workers,
    default eight per CPU and two per group). Returns it and its throughput."""
    model = grouped(scenario, spans, costs)
    ceilings = [s.max_workers or 128 for s in model.stages]
    limit = max_total or int(8 * host.cpus) + 2 * len(spans)
    current = [1] * len(spans)
    best = layout_throughput(scenario, host, spans, current, costs)
    best_at = list(current)
    while sum(current) < limit:
        # A worker for the slowest group that can take one; ties among bottlenecks make a
        # single worker gain nothing, so a step that loses nothing is taken too.
        rates = [
            float(scaling_factor(stage, w))
            / max(stage.us_per_sample + stage.wait_us_per_sample, 1e-9)
            for stage, w in zip(model.stages, current, strict=True)
        ]
        open_groups = [k for k in range(len(spans)) if current[k] < ceilings[k]]
        if not open_groups:
            break
        k = min(open_groups, key=lambda g: rates[g])
        current[k] += 1
        value = layout_throughput(scenario, host, spans, current, costs)
        if value < best * (1.0 - 1e-9):
            break
        if value > best * (1.0 + 1e-9):
            best, best_at = value, list(current)
    current = best_at
    # Then move single workers between groups while that gains: the climb alone can stop
    # where only a trade helps (time-sliced cores make every added worker cost the others).
    improved = True
    while improved:
        improved = False
        for give, take in itertools.permutations(range(len(spans)), 2):
            if current[give] <= 1 or current[take] >= ceilings[take]:
                continue
            trial = list(current)
            trial[give] -= 1
            trial[take] += 1
            value = layout_throughput(scenario, host, spans, trial, costs)
            if value > best * (1.0 + 1e-9):
                best, current, improved = value, trial, True
    return tuple(current), best


@dataclass(frozen=True)
class LayoutChoice:
    """A layout decision: the spans, their allocation, and what the model predicts."""

    spans: tuple[Span, ...]
    allocation: tuple[int, ...]
    predicted: float
    predicted_current: float  # the layout it ran, at its own best allocation
    current: tuple[Span, ...] = ()

    @property
    def changed(self) -> bool:
        """Whether the decision is another layout than the one it ran."""
        return self.spans != self.current


def estimate_costs(
    fn_us: Sequence[float],
    group_cpu_us: Sequence[float],
    spans: Sequence[Span],
    switch_penalty: float = 0.03,
) -> LayoutCosts:
    """Hand-off costs from what a running pipeline measures: each stage function's time per
    item (``fn_us``, per stage as written) and each running group's CPU per item
    (``group_cpu_us``). A group's CPU beyond its functions' is its hand-off; the last group's
    also holds the consumer's crossing. With one group, the two are split evenly."""
    overheads = [
        max(0.0, cpu - sum(fn_us[i:j])) for cpu, (i, j) in zip(group_cpu_us, spans, strict=True)
    ]
    inner = sorted(overheads[:-1])
    handoff = inner[len(inner) // 2] if inner else overheads[-1] / 2.0
    return LayoutCosts(
        handoff_us=handoff,
        consumer_us=max(0.0, overheads[-1] - handoff),
        switch_penalty=switch_penalty,
    )


def choose_layout(
    scenario: Scenario,
    host: HostState,
    costs: LayoutCosts,
    current: Sequence[Span],
    margin: float = 0.03,
    candidates: Sequence[Sequence[Span]] | None = None,
) -> LayoutChoice:
    """The layout to run: the one predicted best at its best allocation, unless it beats the
    layout running now by less than ``margin`` (a change costs a drain; noise must not flip
    it). ``scenario`` holds the stage costs as estimated from measurements."""
    current = [tuple(s) for s in current]
    candidates = candidates or all_layouts(len(scenario.stages))
    now_alloc, now_value = best_allocation(scenario, host, current, costs)
    best = LayoutChoice(tuple(current), now_alloc, now_value, now_value, tuple(current))
    for spans in candidates:
        spans = [tuple(s) for s in spans]
        if spans == current:
            continue
        allocation, value = best_allocation(scenario, host, spans, costs)
        if value > best.predicted and value > now_value * (1.0 + margin):
            best = LayoutChoice(tuple(spans), allocation, value, now_value, tuple(current))
    return best


def dlrm_scenario(cpus: float, noise: float = 0.0) -> tuple[Scenario, LayoutCosts]:
    """The DLRM pipeline's twin for layouts, calibrated as the module's docs say: 3.76 us of
    work per sample (266,155 samples/s on one core in one loop), read at most 4 workers."""
    stages = (
        StageSpec("read", 0.40, max_workers=4, memory_mb_per_worker=40.0),
        StageSpec("parse", 1.20, memory_mb_per_worker=60.0),
        StageSpec("transform", 1.80, scaling=0.97, memory_mb_per_worker=80.0),
        StageSpec("collate", 0.36, memory_mb_per_worker=40.0),
    )
    total = sum(s.us_per_sample for s in stages)
    scenario = Scenario(
        name=f"dlrm-layout-{cpus:g}c", cpus=cpus, memory_gb=64.0, stages=stages, noise=noise
    )
    return scenario, LayoutCosts(handoff_us=0.035 * total, consumer_us=0.05 * total)


@dataclass(frozen=True)
class LayoutRun:
    """The outcome of :func:`run_decision` on a twin."""

    spans: tuple[Span, ...]
    allocation: tuple[int, ...]
    throughput: float  # the truth, noise-free, at the decision's own allocation
    changes: int  # layout changes made
    layout_best: float = 0.0  # the truth at the best allocation of the chosen layout


def run_decision(
    scenario: Scenario,
    costs: LayoutCosts,
    rounds: int = 4,
    seed: int = 0,
    start: Sequence[Span] | None = None,
    margin: float = 0.03,
) -> LayoutRun:
    """The layout decision online on the twin: measure the layout running (each stage
    function's time per item and each group's CPU per item, with the scenario's noise), fit
    the costs from those measurements alone, choose, apply, and again, ``rounds`` times."""
    import numpy as np

    rng = np.random.default_rng(seed)
    host = scenario.host_at(0)
    n = len(scenario.stages)
    spans = [tuple(s) for s in (start or fixed_layouts(n)["staged"])]
    changes = 0

    def noisy(value: float) -> float:
        return value * (1.0 + rng.normal(0.0, scenario.noise)) if scenario.noise else value

    seen: list[list[float]] = []  # every round's function times, averaged as an agent would
    for _ in range(rounds):
        model = grouped(scenario, spans, costs)
        seen.append([noisy(s.us_per_sample) for s in scenario.stages])
        fn_us = [sum(column) / len(seen) for column in zip(*seen, strict=True)]
        group_cpu = [noisy(s.us_per_sample) for s in model.stages]
        estimated = replace(
            scenario,
            stages=tuple(
                replace(s, us_per_sample=max(fn, 1e-6))
                for s, fn in zip(scenario.stages, fn_us, strict=True)
            ),
        )
        fitted = estimate_costs(fn_us, group_cpu, spans, costs.switch_penalty)
        choice = choose_layout(estimated, host, fitted, spans, margin=margin)
        changes += choice.changed
        spans = list(choice.spans)
        allocation = choice.allocation
    return LayoutRun(
        tuple(spans),
        tuple(allocation),
        layout_throughput(scenario, host, spans, allocation, costs),
        changes,
        best_allocation(scenario, host, spans, costs)[1],
    )


def decide_from_metrics(
    rows: Sequence[dict],
    spans: Sequence[Span],
    cpus: float,
    ceilings: Sequence[int | None],
    kinds: Sequence[str] | None = None,
    margin: float = 0.03,
    switch_penalty: float = 0.03,
) -> LayoutChoice:
    """The layout decision from a running pipeline's metrics, one row per stage as written
    (``Pipeline.metrics(by_unit=True)``): each stage's cost is its function's CPU per item
    (``fn_cpu_percent``), each group's hand-off its CPU per item beyond its functions'. Only
    stages of the same ``kind`` fuse (a thread stage that hands batches to the trainer stays
    where it is). Items are whatever the pipeline carries (batches): the rates are in them."""
    n = len(rows)
    fn_us, cpu_us = [], []
    for row in rows:
        rate = max(float(row.get("items_per_s", 0.0)), 1e-9)
        fn_us.append(max(float(row.get("fn_cpu_percent", 0.0)), 1e-6) / 100.0 / rate * 1e6)
        cpu_us.append(max(float(row.get("cpu_percent", 0.0)), 0.0) / 100.0 / rate * 1e6)
    group_cpu = [sum(cpu_us[i:j]) for i, j in spans]
    costs = estimate_costs(fn_us, group_cpu, spans, switch_penalty)
    stages = tuple(
        StageSpec(str(row["name"]), fn, max_workers=ceiling)
        for row, fn, ceiling in zip(rows, fn_us, ceilings, strict=True)
    )
    scenario = Scenario(name="measured", cpus=cpus, memory_gb=1e6, stages=stages)
    candidates = all_layouts(n)
    if kinds is not None:
        candidates = [
            spans_
            for spans_ in candidates
            if all(len({kinds[k] for k in range(i, j)}) == 1 for i, j in spans_)
        ]
    return choose_layout(
        scenario, scenario.host_at(0), costs, spans, margin=margin, candidates=candidates
    )
