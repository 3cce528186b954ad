"""Integer water-filling: the allocation that maximises the slowest stage's modelled capacity.

Used by InTune's rebalance actions. With capacities that grow with workers (per-worker rate x
``workers ** scaling``), adding workers one at a time to the current slowest stage is optimal for a
max-min objective.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

#: A stage whose workers wait (each takes less than a CPU slot, :mod:`agents.budget`) is given
#: workers past the slowest stage's capacity, up to this many times it, while the slots last.
WAITING_HEADROOM = 1.5
#: :func:`peak_total` stops at the smallest total predicted within this of the fastest.
PEAK_TOLERANCE = 0.005


def water_fill(
    per_worker: Sequence[float],
    caps: Sequence[int],
    total: float,
    memory_per_worker: Sequence[float] | None = None,
    memory_limit: float = float("inf"),
    scaling: Sequence[float] | None = None,
    worker_cpu: Sequence[float] | None = None,
    usl: Sequence[tuple[float, float]] | None = None,
) -> tuple[int, ...]:
    """Spread ``total`` CPU slots (at least one worker per stage, within caps and memory) over
    the stages, max-min fairly.

    ``per_worker`` is each stage's capacity at one worker; with ``scaling`` a stage with ``w``
    workers has ``per_worker * w ** scaling``. A worker takes ``worker_cpu`` slots (one each by
    default, :mod:`agents.budget`). With ``usl`` (each stage's ``(sigma, kappa)``, from
    :mod:`tuner.capacity`) capacity is further divided by ``1 + sigma (w - 1) + kappa w (w - 1)``,
    and a stage past its peak cannot grow. Stops early once the slowest stage cannot grow (its
    cap, its peak, the slots or the memory limit): more workers elsewhere would cost CPU and
    memory for nothing. Except at stages whose workers wait (``worker_cpu`` under 1): those then
    grow to :data:`WAITING_HEADROOM` times the slowest stage's capacity while slots, caps and
    memory allow. Their rate is a latency's, which swings with the store and the host's load
    more than a computing stage's, and a worker there costs a fraction of a CPU. (On the
    object-store example, the fill stopped fetch at 14 to 16 threads, which ran at 0.94 of the
    best allocation measured, fetch 24: docs/benchmarks.md.)
    """
    n = len(per_worker)
    workers = [1] * n
    memory = np.zeros(n) if memory_per_worker is None else np.asarray(memory_per_worker, float)
    cost = [1.0] * n if worker_cpu is None else [float(c) for c in worker_cpu]
    used = float(memory.sum())
    exponent = [1.0] * n if scaling is None else list(scaling)
    law = [(0.0, 0.0)] * n if usl is None else list(usl)

    def capacity(i: int, w: int) -> float:
        sigma, kappa = law[i]
        if not (sigma or kappa):
            return per_worker[i] * w ** exponent[i]
        return per_worker[i] * w ** exponent[i] / (1.0 + sigma * (w - 1) + kappa * w * (w - 1))

    heap = [(per_worker[i], i) for i in range(n)]
    heapq.heapify(heap)
    remaining = total - sum(cost)
    while heap:
        _, i = heapq.heappop(heap)
        if workers[i] >= caps[i] or used + memory[i] > memory_limit or cost[i] > remaining + 1e-9:
            break
        if any(law[i]) and capacity(i, workers[i] + 1) <= capacity(i, workers[i]):
            break  # past its peak: another worker makes the slowest stage slower
        workers[i] += 1
        used += memory[i]
        remaining -= cost[i]
        heapq.heappush(heap, (capacity(i, workers[i]), i))
    slowest = min(capacity(i, workers[i]) for i in range(n))
    for i in sorted((i for i in range(n) if cost[i] < 1.0), key=lambda i: cost[i]):
        while (
            workers[i] < caps[i]
            and used + memory[i] <= memory_limit
            and cost[i] <= remaining + 1e-9
            and capacity(i, workers[i]) < WAITING_HEADROOM * slowest
            and not (any(law[i]) and capacity(i, workers[i] + 1) <= capacity(i, workers[i]))
        ):
            workers[i] += 1
            used += memory[i]
            remaining -= cost[i]
    return tuple(workers)


def host_contention(
    law: dict[str, tuple[float, float]], names: list[str], totals: np.ndarray
) -> np.ndarray:
    """``1 + sigma (W - 1) + kappa W (W - 1)`` per total in ``totals`` (rows) and stage
    (columns), 1 for stages without a fitted host law."""
    sigma = np.array([law.get(name, (0.0, 0.0))[0] for name in names])
    kappa = np.array([law.get(name, (0.0, 0.0))[1] for name in names])
    w = np.asarray(totals, dtype=float)[:, None]
    return 1.0 + sigma * (w - 1.0) + kappa * w * (w - 1.0)


def peak_total(
    per_worker: np.ndarray,
    law: dict[str, tuple[float, float]],
    names: list[str],
    smallest: int,
    largest: int,
    cpus: float,
) -> int:
    """The total workers at which the balanced pipeline is predicted fastest under the host
    law: ``min(W, cpus) / sum_i (contention_i(W) / per_worker_i)`` (each stage given workers in
    proportion to its time per item; past ``cpus`` the workers only share the CPUs), over
    ``smallest..largest``. ``largest`` where no stage has a host law."""
    if not law or largest <= smallest:
        return largest
    totals = np.arange(smallest, largest + 1)
    time_per_item = (host_contention(law, names, totals) / np.maximum(per_worker, 1e-12)).sum(1)
    predicted = np.minimum(totals, max(cpus, 1.0)) / time_per_item
    # The smallest total within PEAK_TOLERANCE of the best: a flat top is not worth workers.
    return int(totals[np.argmax(predicted >= predicted.max() * (1.0 - PEAK_TOLERANCE))])
