"""Integer water-filling: the allocation that maximises the slowest stage's modelled capacity.

Used by InTune's rebalance actions. With capacities that grow with workers (per-worker rate x
``workers ** scaling``), adding workers one at a time to the current slowest stage is optimal for a
max-min objective.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np


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
    memory for nothing.
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
    return tuple(workers)
