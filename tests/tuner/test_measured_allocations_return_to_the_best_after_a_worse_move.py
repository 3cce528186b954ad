"""tuner.incumbent's table: a move that measures worse beyond the noise goes back to the best,
one inside the noise is measured again first, and a jump at the same allocation forgets all."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.incumbent import MeasuredAllocations, allocation_key
from tuner.observation import HostObservation, Observation, StageObservation


def reading(workers: tuple[int, int], throughput: float, idle: float = 0.0) -> Observation:
    stages = [
        StageObservation(name, w, throughput, 0.9, 0.5)
        for name, w in zip(("parse", "collate"), workers, strict=True)
    ]
    host = HostObservation(cpus=4, cpu_percent=90, memory_limit_mb=8000, memory_used_mb=1000,
                           worker_budget=4)  # fmt: skip
    return Observation(stages, host, throughput, idle)


@settings(max_examples=60, deadline=None)
@given(
    best=st.floats(100, 1e5),
    drop=st.floats(0.3, 0.9),
    noise=st.lists(st.floats(-0.02, 0.02), min_size=4, max_size=4),
)
def test_a_move_measured_worse_beyond_the_noise_returns_to_the_best(best, drop, noise):
    table = MeasuredAllocations()
    for wobble in noise:
        table.update(reading((3, 1), best * math.exp(wobble)))
    table.update(reading((2, 2), best * drop))
    here, incumbent = allocation_key(reading((2, 2), 1)), allocation_key(reading((3, 1), 1))
    assert table.incumbent() == incumbent
    assert table.verdict(here) == "return"
    assert here in table.losers(incumbent)


def test_a_move_inside_the_noise_is_measured_again_before_it_is_judged():
    table = MeasuredAllocations()
    for value in (1000, 1010, 990):
        table.update(reading((3, 1), value))
    table.update(reading((2, 2), 985))
    assert table.verdict(allocation_key(reading((2, 2), 1))) == "measure"
    table.update(reading((2, 2), 980))
    assert table.verdict(allocation_key(reading((2, 2), 1))) == "return"


def test_a_jump_at_the_same_allocation_forgets_what_was_measured():
    table = MeasuredAllocations()
    for value in (1000, 1010, 990):
        table.update(reading((3, 1), value))
    table.update(reading((2, 2), 800))
    # A co-tenant halved it: the trainer now waits for input (a reading where it never waits
    # would say the trainer slowed instead, "consumer").
    assert table.update(reading((2, 2), 400, idle=0.5)) == "load"
    assert list(table.table) == [allocation_key(reading((2, 2), 1))]
