"""A host's ranks share its budget: the allocation is per rank, and every rank runs it, so the
host's CPU slots and memory hold it once per rank (agents.budget, one definition)."""

from agents.budget import HostBudget, StageBudget, allocation_problems, cpu_slots, most_workers

STAGES = [StageBudget("read"), StageBudget("parse"), StageBudget("collate")]


def test_the_default_budget_has_one_slot_per_stage_of_each_rank():
    assert cpu_slots(2, 3) == 5
    assert cpu_slots(2, 3, ranks=2) == 8
    assert cpu_slots(0.5, 5, ranks=4) == 21


def test_an_allocation_that_fits_one_rank_is_refused_when_two_ranks_run_it():
    workers = {"read": 1, "parse": 3, "collate": 1}  # 5 slots a rank
    assert allocation_problems(workers, STAGES, HostBudget(8, ranks=1)) == []
    problems = allocation_problems(workers, STAGES, HostBudget(8, cpus=2, ranks=2))
    assert problems == [
        "the allocation takes 10 CPU slots (2 ranks x (read 1 x 1, parse 3 x 1, collate 1 x 1)) "
        "but the host budget is 8 CPU slots (2 CPUs); a worker that computes takes one slot, a "
        "worker that waits the CPU it was measured to use"
    ]
    assert (
        allocation_problems({"read": 1, "parse": 2, "collate": 1}, STAGES, HostBudget(8, ranks=2))
        == []
    )


def test_memory_is_counted_once_per_rank():
    stages = [StageBudget("parse", memory_mb_per_worker=100.0)]
    assert allocation_problems({"parse": 3}, stages, HostBudget(10, memory_mb=400)) == []
    (problem,) = allocation_problems({"parse": 3}, stages, HostBudget(10, memory_mb=400, ranks=2))
    assert "needs about 600 MB (2 ranks x (parse: 3 x 100 MB))" in problem


def test_a_stages_most_workers_are_per_rank():
    host = HostBudget(8, ranks=2)  # 4 slots a rank: 2 for the other stages, 2 for this one
    assert most_workers(STAGES[1], STAGES, host) == 2
    assert host.rank_share() == HostBudget(4.0)
