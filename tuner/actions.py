"""InTune's action space and the features its network scores, for any pipeline of 2..16 stages.

Actions move CPU between stages: ``hold``; ``rebalance`` (water-fill the workers over the stages
in proportion to their measured per-worker rates, see :mod:`tuner.balance`, to the CPU slots the
allocation takes now, to one slot per CPU, or to all the host's slots: one step crosses a big
host); ``add`` k workers to a stage from the free slots; ``remove`` k workers from a stage;
``move`` k workers into a stage from the stage that keeps the most capacity after giving them
(choosing the source this way keeps the action count linear in stages). k has three levels
relative to the stage's workers (one worker, about a quarter, and doubling or halving), so that
fine tuning is still possible once a rebalance has crossed the host. Actions that break a stage's
bound, the host's CPU slots (:mod:`agents.budget`: a worker that waits takes only the CPU it was
measured to use, so a waiting stage may have many), or the memory limit (with a margin from
:class:`~tuner.memory.MemoryEstimator`) are masked.

Every feature is computed from measurements only. Per stage, the network also sees the model-based
change of the bottleneck's capacity each action would make, assuming linear scaling; it learns
where that guess is wrong (sublinear scaling, CPU contention, a consumer cap). A stage's first
feature is the CPU slots one of its workers takes: 1 when it computes, its measured CPU per busy
worker when it waits (busy time against CPU time); a waiting stage's capacity barely depends on
the CPU share, and the predicted gains say so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from agents.budget import StageBudget, WorkerCpuMeter, allocation_cpu_slots, group_budgets
from agents.layout import group_workers
from tuner.balance import host_contention, peak_total, water_fill
from tuner.memory import MemoryEstimator
from tuner.observation import Observation

MAX_STAGES = 16
KINDS = ("add", "remove", "move")
LEVELS = 3
PER_STAGE = len(KINDS) * LEVELS
# Rebalance macro-actions: water-fill to the CPU slots taken now, to one per CPU, to all of them.
REBALANCE_TARGETS = ("same", "cpus", "budget")
FIRST_STAGE_ACTION = 1 + len(REBALANCE_TARGETS)
NUM_ACTIONS = FIRST_STAGE_ACTION + MAX_STAGES * PER_STAGE
STAGE_FEATURES = 25
GLOBAL_FEATURES = 10 + 2 * len(REBALANCE_TARGETS)
# Where the predicted gains sit: stage columns 9..17 (add, remove, move x 3 levels, the order of
# the per-stage actions) and global columns 10..12 (the rebalances); gains are log ratios / 3.
STAGE_GAIN_COLUMNS = (9, 18)
GLOBAL_GAIN_COLUMNS = (10, 10 + len(REBALANCE_TARGETS))
GAIN_SCALE = 3.0
# Busy fractions below this are treated as this, so an idle stage's capacity stays finite.
MIN_BUSY = 0.02


def action_index(stage: int, kind: str, level: int) -> int:
    """The index of an action in the flat action vector (0 is hold)."""
    return FIRST_STAGE_ACTION + stage * PER_STAGE + KINDS.index(kind) * LEVELS + level


def _size(kind: str, level: int, workers: int) -> int:
    if level == 0:
        return 1
    if kind == "remove":
        return max(1, round(workers / 4)) if level == 1 else max(1, workers // 2)
    return max(1, round(workers / 4)) if level == 1 else max(1, workers)


def _plural(k: int) -> str:
    return f"{k} worker" if k == 1 else f"{k} workers"


@dataclass
class EncodedState:
    """An observation as the network sees it, plus what each action would do."""

    stage_features: np.ndarray  # [MAX_STAGES, STAGE_FEATURES]
    global_features: np.ndarray  # [GLOBAL_FEATURES]
    stage_present: np.ndarray  # [MAX_STAGES] bool
    mask: np.ndarray  # [NUM_ACTIONS] bool, True = allowed
    allocations: dict[int, tuple[int, ...]]  # action index -> allocation, for allowed actions
    labels: dict[int, str]  # action index -> human-readable label


def measure_worker_cpu(meter: WorkerCpuMeter, observation: Observation) -> dict[str, float]:
    """Fold an observation into ``meter``; return each stage's CPU slots per worker: the
    control plane's when the observation carries them, else the meter's (1 until measured)."""
    meter.update(
        [
            {
                "name": s.name,
                "workers": s.workers,
                "busy_fraction": s.busy_fraction,
                "cpu_percent": s.cpu_percent,
                "runqueue_percent": s.runqueue_percent,
            }
            for s in observation.stages
        ],
        observation.host.cpu_percent,
    )
    measured = meter.worker_cpu()
    return {
        s.name: s.worker_cpu if s.worker_cpu is not None else measured.get(s.name, 1.0)
        for s in observation.stages
    }


def estimated_capacity(observation: Observation) -> np.ndarray:
    """Samples/s each stage could produce with its current workers: output / busy fraction."""
    return np.array(
        [max(s.items_per_s, 1e-9) / max(s.busy_fraction, MIN_BUSY) for s in observation.stages]
    )


def _stage_budgets(names: list[str], cost: np.ndarray) -> list[StageBudget]:
    return [StageBudget(name, worker_cpu=float(c)) for name, c in zip(names, cost, strict=True)]


def _slot_counter(observation: Observation, cost: np.ndarray):
    """CPU slots of a per-stage allocation of ``observation``'s pipeline. With a fused layout
    in force, a group's stages each report the group's workers: the allocation is read as its
    groups run it (:func:`agents.layout.group_workers`) and counted as the budget counts them
    (:func:`agents.budget.group_budgets`), each group's workers once."""
    layout = observation.layout
    if not layout or all(len(group) == 1 for group in layout):
        return lambda allocation: float(np.asarray(allocation, dtype=float) @ cost)
    names = [s.name for s in observation.stages]
    groups = group_budgets(layout, _stage_budgets(names, cost))
    observed = observation.allocation

    def slots(allocation) -> float:
        decided = {name: int(w) for name, w in zip(names, allocation, strict=True)}
        return allocation_cpu_slots(group_workers(decided, observed, layout), groups)

    return slots


def _group_cost(observation: Observation, cost: np.ndarray) -> np.ndarray:
    """Per stage, the CPU slots one more of its workers takes: its group's where a fused
    layout is in force (a fused worker runs all its stages, :func:`agents.budget.group_budgets`)."""
    group_cost = cost.copy()
    if observation.layout and any(len(group) > 1 for group in observation.layout):
        names = [s.name for s in observation.stages]
        groups = group_budgets(observation.layout, _stage_budgets(names, cost))
        for group, counted in zip(observation.layout, groups, strict=True):
            for name in group:
                group_cost[names.index(name)] = counted.worker_cpu
    return group_cost


def oversubscribed_stage(
    observation: Observation, worker_cpu: Mapping[str, float] | None = None
) -> int | None:
    """The stage whose workers alone, one fewer, still ask for every CPU of the host (CPU
    slots, :mod:`agents.budget`), else ``None``; the one holding the most slots if several.

    Such a stage can never run all its workers at once: by the capacity model (the CPUs
    time-sliced among the workers at no cost) its last worker only takes CPU share from its
    neighbours, and it is that no-cost slicing a measurement must check. On the 2-core host,
    DLRM fused, the model rated the fused stage's third worker a gain and the step back to 2
    with prefetch 2 a loss of 26 to 34% (Q over hold), while the quiet machine's sweep measured
    that allocation 7% faster (docs/benchmarks.md, "DLRM fused on the quiet machine"). A
    stage that holds fewer (8 workers of 16 CPUs) is left to the model: on the default twin
    suite, stepping back wherever the whole allocation asked for a worker's CPU more than the
    host has cost intune 0.5% at the median and 1.2% at the worst (150 decisions, 3 seeds),
    its twins' time slicing being free.
    """
    names = [s.name for s in observation.stages]
    cost = _group_cost(observation, np.array([(worker_cpu or {}).get(n, 1.0) for n in names]))
    workers = np.array([s.workers for s in observation.stages], dtype=float)
    cpus = max(observation.host.cpus, 1.0)
    held = (workers - 1.0) * cost
    largest = int(np.argmax(held))
    return largest if held[largest] >= cpus - 1e-9 else None


def encode(
    observation: Observation,
    memory: MemoryEstimator,
    last_per_worker: dict[str, float] | None = None,
    scaling: dict[str, float] | None = None,
    worker_cpu: Mapping[str, float] | None = None,
    usl: Mapping[str, tuple[float, float]] | None = None,
    host_usl: Mapping[str, tuple[float, float]] | None = None,
) -> EncodedState:
    """Features, action mask and candidate allocations for one observation.

    A step that ran out of memory measures no rates; ``last_per_worker`` (each stage's capacity
    per worker at the last good step) then stands in, so that rebalancing, the one move that can
    get under the limit in a single step, stays available. ``scaling`` holds each stage's estimated
    exponent (:mod:`tuner.scaling`); predicted gains and rebalances use ``workers ** scaling``.
    ``worker_cpu`` holds the CPU slots one worker of each stage takes (:func:`measure_worker_cpu`;
    one each when left out). ``usl`` holds the ``(sigma, kappa)`` of the stages whose measured
    capacity follows the Universal Scalability Law instead (:mod:`tuner.capacity`, intune's
    online fit): their capacity is divided by ``1 + sigma (w - 1) + kappa w (w - 1)`` on top of
    ``w ** scaling``, in the predicted gains and in the rebalances. ``host_usl`` holds the
    ``(sigma, kappa)`` of the stages whose capacity per worker falls with the pipeline's TOTAL
    workers ``W`` (:class:`tuner.capacity.HostContentionFit`): their capacity is divided by
    ``1 + sigma (W - 1) + kappa W (W - 1)``, in the predicted gains and in the rebalances, which
    also stop at the total predicted fastest (:func:`tuner.balance.peak_total`).
    """
    stages = observation.stages
    n = len(stages)
    if not 1 <= n <= MAX_STAGES:
        raise ValueError(f"the pipeline has {n} stages; InTune handles 1 to {MAX_STAGES}")
    names = [s.name for s in stages]
    host = observation.host
    workers = np.array([s.workers for s in stages], dtype=int)
    budget = float(host.worker_budget)
    cost = np.array([(worker_cpu or {}).get(name, 1.0) for name in names])
    slots_of = _slot_counter(observation, cost)
    slots = slots_of(workers)  # CPU slots the allocation in force takes
    fused = bool(observation.layout) and any(len(group) > 1 for group in observation.layout)
    group_cost = _group_cost(observation, cost)
    caps = [
        StageBudget(s.name, s.max_workers, float(c)).most_workers or int(budget)
        for s, c in zip(stages, cost, strict=True)
    ]
    limit = max(host.memory_limit_mb, 1.0)
    # What the workers may hold: the limit less what the host holds besides them (the trainer
    # and its embedding tables, the system); the whole limit on a twin, which holds nothing else.
    room = max(limit - host.memory_outside_mb, 1.0)
    mem_mean = memory.per_worker(names)
    mem_upper = memory.per_worker_upper(names)
    memory_now = float(workers @ mem_upper)
    over_memory = memory_now > room or (
        observation.throughput <= 0 and host.memory_used_mb >= limit
    )
    oom = observation.throughput <= 0
    exponent = np.array([(scaling or {}).get(name, 1.0) for name in names])
    law = [(usl or {}).get(name, (0.0, 0.0)) for name in names]
    sigma = np.array([s for s, _ in law])
    kappa = np.array([k for _, k in law])

    def contention(w: np.ndarray) -> np.ndarray:
        return 1.0 + sigma * (w - 1.0) + kappa * w * (w - 1.0)

    capacity = estimated_capacity(observation)
    if oom and last_per_worker and all(name in last_per_worker for name in names):
        capacity = np.array([last_per_worker[name] for name in names]) * workers**exponent
        oom = False  # rates are known after all; global feature 7 still flags the step
        out_of_memory_step = True
    else:
        out_of_memory_step = oom
    bottleneck = float(capacity.min())
    cpus = max(host.cpus, 1.0)

    stage_features = np.zeros((MAX_STAGES, STAGE_FEATURES), dtype=np.float32)
    global_features = np.zeros(GLOBAL_FEATURES, dtype=np.float32)
    present = np.zeros(MAX_STAGES, dtype=bool)
    present[:n] = True
    mask = np.zeros(NUM_ACTIONS, dtype=bool)
    allocations: dict[int, tuple[int, ...]] = {}
    labels: dict[int, str] = {0: "hold"}
    if not over_memory:
        mask[0] = True
        allocations[0] = tuple(int(w) for w in workers)

    # Gather every candidate first, then score them all in one vectorised pass: a decision's
    # latency budget is 5 ms and per-candidate numpy calls would take most of it.
    # Each candidate: (action index, new allocation, label, feature slot, memory slot), where a
    # slot is (row, column) in stage_features, or (-1, column) in global_features.
    candidates: list[tuple[int, list[int], str, tuple[int, int], tuple[int, int] | None]] = []
    base = [int(w) for w in workers]
    if not oom:
        # Capacity at one worker, at the current CPU share.
        per_worker = capacity / workers**exponent
        if usl:
            per_worker = per_worker * contention(workers)
        if host_usl:
            # Capacity per worker with the others' contention undone (at a total of one).
            per_worker = per_worker * host_contention(host_usl, names, [workers.sum()])[0]
            peak = peak_total(per_worker, dict(host_usl), names, n, int(budget), cpus)
        for t, target in enumerate(REBALANCE_TARGETS):
            wanted = {"same": slots, "cpus": min(budget, int(cpus)), "budget": budget}[target]
            wanted = min(max(wanted, float(cost.sum())), budget)
            filled = per_worker
            if host_usl:
                if target != "same":
                    wanted = max(min(wanted, peak * float(cost.mean())), float(cost.sum()))
                total = max(n, round(wanted / max(float(cost.mean()), 1e-9)))
                filled = per_worker / host_contention(host_usl, names, [total])[0]
            new = list(water_fill(filled, caps, wanted, mem_upper, room, exponent, cost, law))
            label = f"rebalance {sum(new)} workers ({target})"
            candidates.append((1 + t, new, label, (-1, 10 + t), (-1, 13 + t)))
    for j, stage in enumerate(stages):
        w = base[j]
        for level in range(LEVELS):
            free = math.floor((budget - slots) / group_cost[j] + 1e-9)
            k = min(_size("add", level, w), caps[j] - w, free)
            if k >= 1:
                new = base.copy()
                new[j] += k
                label = f"add {_plural(k)} to {stage.name}"
                candidates.append(
                    (action_index(j, "add", level), new, label, (j, 9 + level), (j, 18 + level))
                )
            k = min(_size("remove", level, w), w - 1)
            if k >= 1:
                new = base.copy()
                new[j] -= k
                label = f"remove {_plural(k)} from {stage.name}"
                candidates.append(
                    (action_index(j, "remove", level), new, label, (j, 12 + level), None)
                )
            k = min(_size("move", level, w), caps[j] - w)
            if k >= 1 and n > 1:
                givers = [i for i in range(n) if i != j and base[i] - k >= 1]
                if givers:
                    # The source is the stage that keeps the most capacity after giving k.
                    source = max(givers, key=lambda i: capacity[i] * (base[i] - k) / base[i])
                    new = base.copy()
                    new[j] += k
                    new[source] -= k
                    label = f"move {_plural(k)} {stages[source].name} -> {stage.name}"
                    candidates.append(
                        (
                            action_index(j, "move", level),
                            new,
                            label,
                            (j, 15 + level),
                            (j, 21 + level),
                        )
                    )

    if candidates:
        matrix = np.array([c[1] for c in candidates], dtype=float)
        new_memory = matrix @ mem_upper
        memory_fraction = (matrix @ mem_mean) / room
        # CPU slots each candidate takes; a worker asks for about its slots of a CPU while busy.
        totals = matrix @ cost
        if fused:
            # What the budget checks: the groups' workers, once each (agents.budget).
            budget_totals = np.array([slots_of(row) for row in matrix])
        else:
            budget_totals = totals
        share_now = min(1.0, cpus / max(slots, 1e-9))
        share_new = np.minimum(1.0, cpus / totals)
        # A worker takes (1 - c) of waiting plus c / share of CPU time per unit of work: the CPU
        # share moves a stage that computes (c = 1) in full and one that waits hardly at all.
        factor = ((1.0 - cost) + cost / share_now) / (
            (1.0 - cost)[None, :] + cost[None, :] / share_new[:, None]
        )
        new_capacity = capacity * (matrix / workers) ** exponent * factor
        if usl:
            new_capacity = new_capacity * contention(workers) / contention(matrix)
        if host_usl:
            new_capacity = (
                new_capacity
                * host_contention(host_usl, names, [workers.sum()])
                / host_contention(host_usl, names, matrix.sum(1))
            )
        # Scaled to about -1..1; a 20x gain is as good as it gets in one step.
        gains = np.clip(np.log(new_capacity.min(axis=1) / bottleneck), -3.0, 3.0) / GAIN_SCALE
        seen: set[tuple[int, ...]] = {tuple(base)}
        # Over the limit, an agent restarts on the allocation in force after each failed try, so
        # only an allocation that fits in one step helps; partial cuts are kept as a last resort.
        fits = new_memory <= room
        strict = over_memory and bool(fits.any())
        # An agent refuses any allocation above the host's CPU slots (they can shrink under events).
        within_budget = budget_totals <= budget + 1e-9
        for c, (index, new, label, slot, memory_slot) in enumerate(candidates):
            labels[index] = label
            if memory_slot is not None:
                row, column = memory_slot
                target = global_features if row < 0 else stage_features[row]
                target[column] = memory_fraction[c]
            key = tuple(new)
            if key in seen or not within_budget[c]:
                continue
            if new_memory[c] > room and (strict or new_memory[c] >= memory_now):
                continue
            seen.add(key)
            mask[index] = True
            allocations[index] = key
            if not oom:
                row, column = slot
                target = global_features if row < 0 else stage_features[row]
                target[column] = gains[c]

    for j, stage in enumerate(stages):
        w = base[j]
        row = stage_features[j]
        slack = math.log(capacity[j] / bottleneck) if not oom else 0.0
        row[0] = cost[j]
        row[1] = min(slack, 3.0) / 3.0
        row[2] = 1.0 if slack < 0.03 and not oom else 0.0
        row[3] = stage.busy_fraction
        row[4] = stage.queue_fill
        row[5] = math.log2(w) / 7.0
        row[6] = w * cost[j] / budget
        row[7] = min(1.0, (caps[j] - w) / w)
        row[8] = w * mem_mean[j] / room
        row[24] = exponent[j]

    global_features[0] = observation.trainer_idle_fraction
    global_features[1] = host.cpu_percent / 100.0
    global_features[2] = min(2.0, host.memory_used_mb / limit)
    global_features[3] = slots / budget
    global_features[4] = min(4.0, slots / cpus) / 4.0
    global_features[5] = (budget - slots) / budget
    if not out_of_memory_step:
        global_features[6] = float(np.clip(math.log(bottleneck / observation.throughput), 0, 2))
    global_features[7] = 1.0 if out_of_memory_step else 0.0
    global_features[8] = n / MAX_STAGES
    global_features[9] = math.log2(cpus) / 7.0
    if not mask.any():
        # Nothing is safe to try: keep what is in force rather than guess.
        mask[0] = True
        allocations[0] = tuple(int(w) for w in workers)
    return EncodedState(stage_features, global_features, present, mask, allocations, labels)
