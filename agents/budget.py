"""The budget an allocation must fit: one definition for the agent, the control plane and the tuner.

What is scarce on a trainer host is CPU and memory, not the number of workers. A worker that
computes keeps a CPU busy whenever it has work; a worker that waits (a thread fetching from an
object store) uses little CPU however long it waits. So the budget counts CPU slots:

- A host has ``cpu_slots(cpus, stages, ranks) = max(1, floor(cpus)) + stages * ranks`` slots:
  its whole CPUs (at least one) plus one per stage of each local rank's pipeline (a host that
  trains with ``torchrun --nproc-per-node N`` runs N pipelines; one rank is the default).
  The operating system time-slices the CPUs among the workers, as it does for tf.data's
  parallelism, so even a one-CPU host has a choice of how to split them. ``--worker-budget``
  on the agent, or ``worker_budget`` at registration, sets another number of slots.
- One worker of a stage takes ``worker_cpu`` slots: 1 until the stage has been measured, and 1
  when it computes. When its workers wait (one busy worker was measured to use less than half a
  CPU: ``(cpu_percent + runqueue_percent) / 100 / (workers * busy_fraction) < 0.5``), the CPU
  one busy worker uses (``cpu_percent / 100 / (workers * busy_fraction)``), at least 1/64 of a
  slot. ``runqueue_percent`` is the time the workers were runnable but waiting for a CPU (the
  scheduler's run-queue delay): a worker held back by other work on the host wanted that CPU,
  so it counts as computing, not as waiting. A waiting worker's own wake-ups also wait on a
  loaded run queue; that is the load's, so its cost stays the CPU it used.
- An allocation is per rank: every local rank's pipeline runs it (docs/architecture.md,
  "Multi-rank hosts"). It takes ``ranks * sum(workers * worker_cpu)`` slots, at most the
  host's: the ranks share the host's CPUs and memory. A stage whose workers wait has at most
  64 workers (``MAX_WAITING_WORKERS``); every stage at most its own ``max_workers``.
- Its memory, ``ranks * sum(workers * memory_mb_per_worker)`` over the stages whose memory per
  worker is known, is at most the memory budget.

When the host's CPUs are saturated, a worker is measured using less CPU than it would use: time
slicing, not waiting, holds it back. Then each stage's CPU per busy worker, at most one, is
divided by the largest among the stages (a stage that computes gets exactly its share of a CPU)
before it is compared with one half, so a stage counts as waiting only next to the stages that
compute; the division only ever raises a stage's reading.

This module imports nothing of the project: the agent, the control plane (``webapp/``) and the
tuner (``tuner/``) all import it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agents.layout import SEPARATOR as LAYOUT_SEPARATOR

#: The most workers a stage whose workers wait may have, however little CPU they use.
MAX_WAITING_WORKERS = 64
#: A stage whose busy workers use less than this of a CPU each waits; at or above, it computes.
WAITING_BELOW = 0.5
#: The fewest CPU slots a worker takes, however little it was measured to use.
MIN_WORKER_CPU = 1.0 / 64
#: Host CPU use (percent of all its CPUs) from which the measured CPU per worker is deflated by
#: time slicing and is read relative to the stages that compute.
SATURATED_PERCENT = 90.0
#: Busy worker-seconds per second below which a stage's CPU per busy worker is not measured: a
#: stage that hardly ran says nothing about what its workers cost.
MIN_BUSY_WORKERS = 0.05
#: Measurements a :class:`WorkerCpuMeter` averages over (one a second on the agent).
METER_WINDOW = 10
#: How far the agent lets waiting workers' CPU exceed what the control plane saw: its own
#: measurement is a few seconds newer, and a waiting stage's CPU per worker moves by this much
#: from one window to the next; refusing there would cost a decision for nothing.
AGENT_WAITING_TOLERANCE = 0.2
#: Ranks whose needs for a stage differ by less than this ratio measure alike and get the same
#: workers: a busy fraction moves by a few tens of percent from one second to the next on a
#: shared host, and a split that followed it would move workers back and forth for nothing.
ALIKE_WITHIN = 1.5
#: The host agent moves its ranks to a new split of the allocation in force, without a new
#: allocation, only when the split lightens the most loaded rank of some stage by this factor
#: (:func:`split_gain`): needs drift by a few tens of percent from one report to the next, and a
#: move stops and starts workers (a process worker takes about a second to be useful).
REBALANCE_GAIN = 1.25
#: The agent's default memory budget, as a fraction of the host's (cgroup) memory limit.
MEMORY_BUDGET_FRACTION = 0.8
# Room for float sums: 0.1 * 3 slots must fit in 0.3.
_EPSILON = 1e-9


def cpu_slots(cpus: float, stage_count: int, ranks: int = 1) -> int:
    """Return the host's default CPU slots: its whole CPUs, at least one, plus one per stage of
    each of its ``ranks`` pipelines (so that one worker per stage per rank always fits)."""
    return max(1, math.floor(cpus)) + stage_count * max(1, int(ranks))


def default_memory_budget_mb(memory_limit_mb: float) -> float:
    """Return the agent's default memory budget: 80% of the host's memory limit."""
    return MEMORY_BUDGET_FRACTION * memory_limit_mb


def cpu_per_busy_worker(
    cpu_percent: float, workers: int, busy_fraction: float, runqueue_percent: float = 0.0
) -> float | None:
    """Return the CPUs one busy worker of a stage used or wanted, or ``None`` when too little
    ran to say.

    ``cpu_percent`` is the stage's CPU use over all its workers (100 is one CPU; 0 is taken as
    not measured), ``busy_fraction`` the fraction of the time its workers spent in the stage's
    function, ``runqueue_percent`` the time its workers spent runnable but waiting for a CPU,
    in the same unit (100 is one worker waiting the whole time; 0 when not measured).

    A worker on the run queue wanted a CPU: that time counts as CPU, not as waiting. Without it
    a stage that computes on a host loaded by other work reads as a stage whose workers wait,
    and the budget would let it have many more workers than there are CPUs.
    """
    busy_workers = workers * busy_fraction
    if busy_workers < MIN_BUSY_WORKERS or cpu_percent <= 0:
        return None
    wanted = cpu_percent + max(0.0, runqueue_percent or 0.0)
    return wanted / 100.0 / busy_workers


def worker_cpu(cpu_per_busy: float | None) -> float:
    """Return the CPU slots one worker takes, from the CPU one busy worker uses.

    ``None`` (not measured yet) and anything from :data:`WAITING_BELOW` up is one slot; below,
    the measured CPU, at least :data:`MIN_WORKER_CPU`.
    """
    if cpu_per_busy is None or cpu_per_busy >= WAITING_BELOW:
        return 1.0
    return max(MIN_WORKER_CPU, cpu_per_busy)


def relative_cpu_per_busy_worker(
    stages: Iterable[Mapping], host_cpu_percent: float | None
) -> dict[str, float]:
    """Return each measured stage's CPU per busy worker, read against its neighbours when the
    host is saturated (see the module docstring).

    ``stages`` are the protocol's stage fields (``name``, ``workers``, ``busy_fraction``,
    ``cpu_percent`` and, when measured, ``runqueue_percent``); ``host_cpu_percent`` the host's
    CPU use (100 is all its CPUs).
    """
    raw = {}
    for stage in stages:
        cpu = stage.get("cpu_percent")
        if not cpu or cpu <= 0:
            # Even a waiting worker uses some CPU: none at all means nothing was measured.
            continue
        workers = int(stage.get("workers") or 0)
        busy = float(stage.get("busy_fraction") or 0.0)
        wanted = cpu_per_busy_worker(
            float(cpu), workers, busy, float(stage.get("runqueue_percent") or 0.0)
        )
        if wanted is None:
            continue
        # A worker that was runnable at least half its busy time computes, however little of
        # the CPU it got; one that waits costs the CPU it used. Its wake-ups wait on a loaded
        # host's run queue too, and that wait is the load's, not a cost of the worker.
        used = cpu_per_busy_worker(float(cpu), workers, busy)
        value = wanted if wanted >= WAITING_BELOW or used is None else used
        # No worker takes more than one CPU. A stage busy a few percent of the time reads
        # above one (its workers' CPU outside the timed function: hand-offs, queue waits),
        # and as the scale below it would deflate the stages that compute into waiting ones
        # (measured on the DLRM pipeline under load: prefetch at 2.6 CPUs per busy worker
        # made parse read 0.38, and both intune and prior gave parse 7 to 9 workers on 2 CPUs).
        raw[str(stage["name"])] = min(1.0, value)
    saturated = host_cpu_percent is not None and host_cpu_percent >= SATURATED_PERCENT
    scale = max(raw.values(), default=0.0) if saturated else 1.0
    if scale <= 0:
        return {}
    return {name: min(1.0, value / scale) for name, value in raw.items()}


class WorkerCpuMeter:
    """Each stage's CPU slots per worker over the last few measurements.

    Fed one measurement at a time (:meth:`update`); a stage keeps what it was last measured at
    while it hardly runs, and takes one slot per worker until it was measured at all.
    """

    def __init__(self, window: int = METER_WINDOW) -> None:
        self.window = window
        # Per stage: (CPU seconds, busy worker-seconds) of each recent measurement.
        self._seen: dict[str, deque[tuple[float, float]]] = {}

    def update(self, stages: Iterable[Mapping], host_cpu_percent: float | None) -> None:
        """Fold in one measurement: the protocol's stage fields and the host's CPU use."""
        stages = list(stages)
        relative = relative_cpu_per_busy_worker(stages, host_cpu_percent)
        for stage in stages:
            name = str(stage["name"])
            if name not in relative:
                continue
            busy = int(stage["workers"]) * float(stage["busy_fraction"])
            seen = self._seen.setdefault(name, deque(maxlen=self.window))
            seen.append((relative[name] * busy, busy))

    def worker_cpu(self) -> dict[str, float]:
        """CPU slots one worker of each measured stage takes (stages not measured are absent)."""
        costs = {}
        for name, seen in self._seen.items():
            busy = sum(b for _, b in seen)
            costs[name] = worker_cpu(sum(c for c, _ in seen) / busy if busy > 0 else None)
        return costs

    def state_dict(self) -> dict:
        """The measurements held, for checkpoints."""
        return {"window": self.window, "seen": {k: list(v) for k, v in self._seen.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.window = int(state["window"])
        self._seen = {
            name: deque((tuple(pair) for pair in seen), maxlen=self.window)
            for name, seen in state["seen"].items()
        }


@dataclass(frozen=True)
class StageBudget:
    """What a check knows about one stage."""

    name: str
    max_workers: int | None = None
    #: CPU slots one worker takes (1 for a stage that computes or was not measured yet).
    worker_cpu: float = 1.0
    #: Memory one more worker costs, declared or measured; ``None`` when unknown or for thread
    #: stages, whose workers share the process's memory.
    memory_mb_per_worker: float | None = None

    @property
    def waits(self) -> bool:
        """Whether this stage's workers were measured to wait rather than compute."""
        return self.worker_cpu < 1.0

    @property
    def most_workers(self) -> int | None:
        """The stage's own bound on its workers (``max_workers``, 64 when it waits), if any."""
        bounds = [b for b in (self.max_workers, MAX_WAITING_WORKERS if self.waits else None) if b]
        return min(bounds) if bounds else None


@dataclass(frozen=True)
class HostBudget:
    """What the host offers an allocation."""

    cpu_slots: float
    memory_mb: float | None = None
    #: The host's CPUs, only to say them in messages.
    cpus: float | None = None
    #: Local ranks (training processes) whose pipelines each run the allocation.
    ranks: int = 1

    def rank_share(self) -> HostBudget:
        """One rank's share of the host: its slots, memory and CPUs divided by the ranks.

        An allocation (per rank) fits the host exactly when it fits this share.
        """
        n = max(1, int(self.ranks))
        return HostBudget(
            self.cpu_slots / n,
            None if self.memory_mb is None else self.memory_mb / n,
            None if self.cpus is None else self.cpus / n,
        )


def _number(value: float) -> str:
    return f"{round(value, 2):g}"


def group_budgets(
    layout: Sequence[Sequence[str]], stages: Sequence[StageBudget]
) -> list[StageBudget]:
    """A layout's groups (agents.layout) as the budget counts them, named as the allocation's
    ``workers`` name them (``read+parse``): a group's ceiling is its stages' lowest, a worker
    takes the most CPU slots any of its stages takes (it runs them all in turn), and the memory
    of all of them (unknown if any is)."""
    by_name = {s.name: s for s in stages}
    result = []
    for group in layout:
        parts = [by_name[n] for n in group]
        ceilings = [p.max_workers for p in parts if p.max_workers is not None]
        memory = [p.memory_mb_per_worker for p in parts]
        result.append(
            StageBudget(
                LAYOUT_SEPARATOR.join(group),
                max_workers=min(ceilings) if ceilings else None,
                worker_cpu=max(p.worker_cpu for p in parts),
                memory_mb_per_worker=None if None in memory else sum(memory),
            )
        )
    return result


def allocation_cpu_slots(workers: Mapping[str, int], stages: Sequence[StageBudget]) -> float:
    """CPU slots an allocation takes: the sum of workers x slots per worker over the stages."""
    return sum(int(workers.get(s.name, 0)) * s.worker_cpu for s in stages)


def allocation_memory_mb(workers: Mapping[str, int], stages: Sequence[StageBudget]) -> float:
    """Estimated memory of an allocation: workers x memory per worker, where that is known."""
    return sum(
        int(workers.get(s.name, 0)) * s.memory_mb_per_worker
        for s in stages
        if s.memory_mb_per_worker is not None
    )


def most_workers(stage: StageBudget, stages: Sequence[StageBudget], host: HostBudget) -> int:
    """The most workers ``stage`` may have (per rank) while every other stage keeps one."""
    others = sum(s.worker_cpu for s in stages if s.name != stage.name)
    room = math.floor((host.rank_share().cpu_slots - others) / stage.worker_cpu + _EPSILON)
    bound = stage.most_workers
    return max(1, min(room, bound) if bound is not None else room)


def shape_problems(workers: object, stages: Sequence[StageBudget]) -> list[str]:
    """Every reason ``workers`` does not fit ``stages``' shape: a stage left out or unknown, a
    count that is not a whole number of at least 1 or is above the stage's bound."""
    if not isinstance(workers, Mapping):
        return [
            "the allocation's workers must be an object of stage name -> worker count, "
            f"got {workers!r}"
        ]
    names = [s.name for s in stages]
    known = ", ".join(names)
    problems = [
        f"the allocation names unknown stage '{name}'; the pipeline's stages are {known}"
        for name in workers
        if name not in names
    ]
    problems += [
        f"the allocation leaves out stage '{name}'; every stage ({known}) needs a worker count"
        for name in names
        if name not in workers
    ]
    for stage in stages:
        if stage.name not in workers:
            continue
        count = workers[stage.name]
        # bool is an int in Python, but "parse": true is a bug upstream, not a count.
        if isinstance(count, bool) or not isinstance(count, int):
            problems.append(
                f"stage '{stage.name}' asks for {count!r} workers; counts must be whole numbers"
            )
        elif count < 1:
            problems.append(
                f"stage '{stage.name}' asks for {count} workers; every stage needs at least 1"
            )
        elif stage.max_workers is not None and count > stage.max_workers:
            problems.append(
                f"stage '{stage.name}' asks for {count} workers but the stage allows at most "
                f"{stage.max_workers} (its max_workers)"
            )
        elif stage.waits and count > MAX_WAITING_WORKERS:
            problems.append(
                f"stage '{stage.name}' asks for {count} workers but a stage whose workers wait "
                f"may have at most {MAX_WAITING_WORKERS} (one of its workers was measured using "
                f"{_number(stage.worker_cpu)} of a CPU)"
            )
    return problems


def allocation_problems(
    workers: object,
    stages: Sequence[StageBudget],
    host: HostBudget,
    *,
    waiting_tolerance: float = 0.0,
    cpu_hint: str = "",
    memory_hint: str = "",
) -> list[str]:
    """Every reason to refuse ``workers`` (stage name -> worker count); empty when it fits.

    ``workers`` is per rank: each of ``host.ranks`` pipelines runs it, so the host's CPU slots
    and memory hold ``host.ranks`` times what it takes. The allocation's shape (stages, counts,
    per-stage bounds) is checked first; the budgets only when the shape is sound.
    ``waiting_tolerance`` lets waiting workers' CPU be that fraction above the budget (the
    agent's, :data:`AGENT_WAITING_TOLERANCE`); the hints say how to allow more and end the
    budget sentences.
    """
    problems = shape_problems(workers, stages)
    if problems:
        return problems
    assert isinstance(workers, Mapping)
    ranks = max(1, int(host.ranks))
    computing = ranks * sum(int(workers[s.name]) for s in stages if not s.waits)
    waiting = ranks * sum(int(workers[s.name]) * s.worker_cpu for s in stages if s.waits)
    if computing + waiting / (1.0 + waiting_tolerance) > host.cpu_slots + _EPSILON:
        detail = ", ".join(f"{s.name} {workers[s.name]} x {_number(s.worker_cpu)}" for s in stages)
        if ranks > 1:
            detail = f"{ranks} ranks x ({detail})"
        cpus = f" ({_number(host.cpus)} CPUs)" if host.cpus is not None else ""
        hint = f" ({cpu_hint})" if cpu_hint else ""
        problems.append(
            f"the allocation takes {_number(computing + waiting)} CPU slots ({detail}) but the "
            f"host budget is {_number(host.cpu_slots)} CPU slots{cpus}; a worker that computes "
            f"takes one slot, a worker that waits the CPU it was measured to use{hint}"
        )
    if host.memory_mb is not None:
        needed = ranks * allocation_memory_mb(workers, stages)
        if needed > host.memory_mb + _EPSILON:
            detail = ", ".join(
                f"{s.name}: {workers[s.name]} x {s.memory_mb_per_worker:.0f} MB"
                for s in stages
                if s.memory_mb_per_worker is not None
            )
            if ranks > 1:
                detail = f"{ranks} ranks x ({detail})"
            hint = f" ({memory_hint})" if memory_hint else ""
            problems.append(
                f"the allocation needs about {needed:.0f} MB ({detail}) but the memory budget "
                f"is {host.memory_mb:.0f} MB{hint}"
            )
    return problems


def rank_need(stages: Iterable[Mapping]) -> dict[str, float]:
    """One rank's measured need per stage: its busy workers (``workers * busy_fraction``).

    The ranks of a DDP job take the same samples/s (each step waits for all of them), so a
    stage's busy workers on a rank are that rank's time per item at the common rate: a rank
    whose items cost twice as much keeps twice as many workers busy.
    """
    return {
        str(s["name"]): max(0.0, float(s.get("workers") or 0) * float(s.get("busy_fraction") or 0))
        for s in stages
    }


def _largest_remainder(count: int, weights: Mapping[int, float], room: Mapping[int, int]) -> dict:
    """Share ``count`` among ``weights``' keys in proportion, none past its ``room``; what no
    key has room for is left out. Equal weights share alike (ties go to the lower key)."""
    given = dict.fromkeys(weights, 0)
    left = count
    open_ = [k for k in sorted(weights) if room[k] > 0]
    while left > 0 and open_:
        total = sum(weights[k] for k in open_)
        quotas = {k: left * (weights[k] / total if total > 0 else 1.0 / len(open_)) for k in open_}
        share = {k: min(room[k] - given[k], math.floor(quotas[k] + _EPSILON)) for k in open_}
        handed = sum(share.values())
        by_rest = sorted(open_, key=lambda k: (-(quotas[k] - math.floor(quotas[k] + _EPSILON)), k))
        for k in by_rest:
            if handed >= left:
                break
            if given[k] + share[k] < room[k]:
                share[k] += 1
                handed += 1
        for k in open_:
            given[k] += share[k]
        left -= handed
        open_ = [k for k in open_ if given[k] < room[k]]
        if handed == 0:
            break
    return given


def split_across_ranks(
    workers: Mapping[str, int],
    needs: Mapping[int, Mapping[str, float]],
    max_workers: Mapping[str, int | None] | None = None,
) -> dict[int, dict[str, int]]:
    """Split the host's allocation among its ranks by what each measured it needs.

    ``workers`` is the per-rank allocation the control plane decided: the host runs
    ``len(needs) * workers[stage]`` workers of each stage in all, and so does every split.
    ``needs`` holds, per rank, each stage's measured need (:func:`rank_need`; a rank or stage
    not measured counts as the mean of the others). Each rank gets at least one worker per
    stage and at most the stage's ``max_workers``; the rest goes in proportion to the ranks'
    needs. Ranks that measure alike (needs within :data:`ALIKE_WITHIN` of each other) get
    ``workers`` each. The total per stage never exceeds
    the host's, so a split fits wherever ``workers`` fits (the budget counts a stage's
    workers alike on every rank).
    """
    ranks = sorted(needs)
    if not ranks:
        return {}
    bounds = max_workers or {}
    split: dict[int, dict[str, int]] = {rank: {} for rank in ranks}
    for stage, per_rank in workers.items():
        per_rank = max(1, int(per_rank))
        total = per_rank * len(ranks)
        measured = {r: float(needs[r][stage]) for r in ranks if needs[r].get(stage) is not None}
        known = [v for v in measured.values() if v > 0]
        fill = sum(known) / len(known) if known else 1.0
        need = {r: measured.get(r) or fill for r in ranks}
        if max(need.values()) < ALIKE_WITHIN * min(need.values()):
            need = dict.fromkeys(ranks, 1.0)
        # Each rank's proportional share of the total, less the one worker it gets anyway.
        weights = {r: max(0.0, total * need[r] / sum(need.values()) - 1) for r in ranks}
        cap = bounds.get(stage)
        room = {r: (int(cap) if cap else total) - 1 for r in ranks}
        extra = _largest_remainder(total - len(ranks), weights, room)
        for rank in ranks:
            split[rank][stage] = 1 + extra[rank]
    return split


def split_gain(
    needs: Mapping[int, Mapping[str, float]],
    current: Mapping[int, Mapping[str, int]],
    new: Mapping[int, Mapping[str, int]],
) -> float:
    """How much ``new`` lightens the most loaded rank against ``current``: the largest, over the
    stages, of ``max(need / workers)`` over the ranks under ``current`` divided by the same
    under ``new``; 1.0 when nothing can be said (a rank or stage not measured, or no change).

    DDP steps at the pace of its slowest rank, and a stage's slowest rank is the one whose
    workers each carry the most of its need (busy workers, :func:`rank_need`); a split that
    lowers that load by a factor lets the stage keep up with that factor more samples/s.
    """
    ranks = sorted(new)
    if not ranks or sorted(current) != ranks or sorted(needs) != ranks:
        return 1.0
    gain = 1.0
    for stage in new[ranks[0]]:
        try:
            need = {r: float(needs[r][stage]) for r in ranks}
            before = max(need[r] / current[r][stage] for r in ranks)
            after = max(need[r] / new[r][stage] for r in ranks)
        except (KeyError, ZeroDivisionError, TypeError):
            continue
        if min(need.values()) <= 0 or after <= 0:
            continue
        gain = max(gain, before / after)
    return gain
