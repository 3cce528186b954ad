"""Water-filling gives the best max-min allocation, as a search of every allocation confirms."""

import itertools

import numpy as np
import pytest

from tuner.balance import water_fill


@pytest.mark.parametrize("seed", range(20))
def test_water_fill_matches_exhaustive_search(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 4))
    rates = rng.uniform(1.0, 10.0, n)
    exponents = rng.uniform(0.5, 1.0, n)
    total = int(rng.integers(n, 10))
    caps = [int(c) for c in rng.integers(1, 8, n)]
    got = water_fill(rates, caps, total, scaling=exponents)

    def slowest(allocation):
        return min(r * w**e for r, w, e in zip(rates, allocation, exponents, strict=True))

    best = max(
        slowest(a) for a in itertools.product(*[range(1, c + 1) for c in caps]) if sum(a) <= total
    )
    assert sum(got) <= total
    assert slowest(got) == pytest.approx(best)


def test_water_fill_keeps_within_memory():
    got = water_fill([1.0, 1.0], [100, 100], 50, memory_per_worker=[100, 300], memory_limit=2000)
    assert got[0] * 100 + got[1] * 300 <= 2000


def test_a_waiting_stage_gets_headroom_past_the_slowest_stage_while_the_slots_last():
    # fetch waits (a thread takes 0.05 of a CPU slot, 9 items/s each); decode computes and may
    # have one worker (100 items/s), so it is the slowest stage whatever fetch gets.
    rates, caps, cost = [9.0, 100.0], [64, 1], [0.05, 1.0]
    assert water_fill(rates, caps, 8.0, worker_cpu=cost) == (17, 1)  # 153: past 1.5 x 100
    # A computing stage stops once past the slowest: more would cost CPU for nothing.
    assert water_fill(rates, caps, 80.0) == (12, 1)
    # Nor past the slots: 0.2 slots left after one worker each buy 4 more threads.
    assert water_fill(rates, caps, 1.25, worker_cpu=cost) == (5, 1)
    # Nor past the stage's cap or the memory limit.
    assert water_fill(rates, [12, 1], 8.0, worker_cpu=cost) == (12, 1)
    got = water_fill(rates, caps, 8.0, [10.0, 0.0], 130.0, worker_cpu=cost)
    assert got == (13, 1)
