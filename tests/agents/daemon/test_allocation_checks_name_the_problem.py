"""check_allocation refuses every kind of bad allocation with a reason a person can act on."""

import pytest

from agents.daemon.checks import StageLimits, check_allocation

STAGES = [
    StageLimits("read", max_workers=4, memory_mb_per_worker=100.0),
    StageLimits("parse", max_workers=8, memory_mb_per_worker=300.0),
    StageLimits("collate", max_workers=None, memory_mb_per_worker=None),  # a thread stage
]


def check(workers, budget=12, memory=10_000.0):
    return check_allocation(workers, STAGES, worker_budget=budget, memory_budget_mb=memory)


def test_a_sound_allocation_passes():
    assert check({"read": 2, "parse": 6, "collate": 1}) is None


@pytest.mark.parametrize(
    "workers, words",
    [
        ({"read": 1, "parse": 1, "collate": 1, "decode": 1}, ["unknown stage 'decode'"]),
        ({"read": 1, "parse": 1}, ["leaves out stage 'collate'"]),
        ({"read": 0, "parse": 1, "collate": 1}, ["'read' asks for 0", "at least 1"]),
        ({"read": -2, "parse": 1, "collate": 1}, ["'read' asks for -2"]),
        ({"read": 1.5, "parse": 1, "collate": 1}, ["'read' asks for 1.5", "whole number"]),
        ({"read": True, "parse": 1, "collate": 1}, ["'read' asks for True"]),
        ({"read": "2", "parse": 1, "collate": 1}, ["'read' asks for '2'"]),
        ({"read": 5, "parse": 1, "collate": 1}, ["'read' asks for 5", "at most 4"]),
        (
            {"read": 4, "parse": 8, "collate": 1},
            ["takes 13 CPU slots", "budget is 12 CPU slots", "--worker-budget"],
        ),
    ],
)
def test_a_bad_allocation_is_refused_with_its_reason(workers, words):
    reason = check(workers)
    assert reason is not None
    for word in words:
        assert word in reason


def test_an_allocation_over_the_memory_budget_is_refused_with_the_estimate():
    # 2 x 100 + 6 x 300 = 2000 MB against a 1500 MB budget; the thread stage costs nothing.
    reason = check({"read": 2, "parse": 6, "collate": 3}, memory=1500.0)
    assert reason is not None
    assert "about 2000 MB" in reason and "1500 MB" in reason and "parse: 6 x 300 MB" in reason
    assert check({"read": 2, "parse": 4, "collate": 3}, memory=1500.0) is None


def test_workers_that_are_not_a_mapping_are_refused():
    assert "stage name -> worker count" in check([1, 2, 3])
