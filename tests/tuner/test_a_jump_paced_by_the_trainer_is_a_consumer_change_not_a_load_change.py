"""tuner.incumbent tells a change of the trainer's rate from a change of the host's load: a jump
up from a reading where the trainer never waited, or down to one, is the trainer's ("consumer");
any other jump is the host's ("load"). Both forget the table; only "load" clears intune's
capacity fits (tuner/intune.py), which is what lost mw-holdout-11-consumer_change its optimum."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.incumbent import CONSUMER_BOUND, MeasuredAllocations
from tuner.observation import HostObservation, Observation, StageObservation


def reading(throughput: float, idle: float) -> Observation:
    stages = [StageObservation("parse", 3, throughput, 0.5, 0.9)]
    host = HostObservation(cpus=4, cpu_percent=60, memory_limit_mb=8000, memory_used_mb=1000,
                           worker_budget=4)  # fmt: skip
    return Observation(stages, host, throughput, idle)


paced = st.floats(0.0, CONSUMER_BOUND * 0.99)
waiting = st.floats(CONSUMER_BOUND, 1.0)


@settings(max_examples=80, deadline=None)
@given(
    before=st.floats(100, 1e6),
    factor=st.floats(1.4, 10.0),
    rise=st.booleans(),
    paced_idle=paced,
    waiting_idle=waiting,
    wobble=st.lists(st.floats(-0.01, 0.01), min_size=3, max_size=3),
)
def test_a_jump_on_the_trainer_paced_side_is_a_consumer_change(
    before, factor, rise, paced_idle, waiting_idle, wobble
):
    table = MeasuredAllocations()
    # The lower side of the jump is trainer-paced: before a rise, after a fall.
    low_idle, high_idle = paced_idle, waiting_idle
    first_idle, after_idle = (low_idle, high_idle) if rise else (high_idle, low_idle)
    for w in wobble:
        assert table.update(reading(before * math.exp(w), first_idle)) is None
    after = before * factor if rise else before / factor
    assert table.update(reading(after, after_idle)) == "consumer"
    assert len(table.table) == 1 and table.changes == 1


@settings(max_examples=80, deadline=None)
@given(
    before=st.floats(100, 1e6),
    factor=st.floats(1.4, 10.0),
    rise=st.booleans(),
    first_idle=waiting,
    after_idle=waiting,
)
def test_a_jump_while_the_trainer_waits_on_both_sides_is_a_load_change(
    before, factor, rise, first_idle, after_idle
):
    table = MeasuredAllocations()
    for _ in range(3):
        table.update(reading(before, first_idle))
    after = before * factor if rise else before / factor
    assert table.update(reading(after, after_idle)) == "load"


@settings(max_examples=40, deadline=None)
@given(before=st.floats(100, 1e6), factor=st.floats(1.4, 10.0), idle=paced)
def test_a_fall_from_a_trainer_paced_reading_to_a_waiting_one_is_a_load_change(
    before, factor, idle
):
    # A co-tenant arriving while the trainer set the pace: the pipeline falls behind it.
    table = MeasuredAllocations()
    for _ in range(3):
        table.update(reading(before, idle))
    assert table.update(reading(before / factor, 0.5)) == "load"
