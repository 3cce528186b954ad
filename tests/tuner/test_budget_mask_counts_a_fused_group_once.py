"""With stages fused (layout "auto"), each stage of a group reports the group's workers. The
tuner's budget mask counts them as agents.budget.group_budgets does: each group's workers once,
at the most CPU slots any of its stages takes; not once per stage."""

from agents.budget import HostBudget, StageBudget, allocation_problems, group_budgets
from agents.layout import group_workers
from tuner.actions import encode
from tuner.memory import MemoryEstimator
from tuner.observation import HostObservation, Observation, StageObservation

LAYOUT = [["read", "parse"], ["transform"]]
WORKER_CPU = {"read": 0.5, "parse": 1.0, "transform": 1.0}


def _observation(layout=LAYOUT) -> Observation:
    stages = [
        StageObservation("read", 3, 900.0, 0.6, 0.9),
        StageObservation("parse", 3, 900.0, 0.9, 0.5),
        StageObservation("transform", 2, 900.0, 1.0, 0.1),
    ]
    host = HostObservation(
        cpus=6.0, cpu_percent=90.0, memory_limit_mb=64_000, memory_used_mb=1_000, worker_budget=6
    )
    return Observation(stages, host, throughput=900.0, trainer_idle_fraction=0.2, layout=layout)


def _allowed(state) -> dict[str, tuple[int, ...]]:
    return {state.labels[i]: state.allocations[i] for i in state.allocations}


def test_it_lets_a_fused_pipeline_add_workers_into_the_slots_it_really_has():
    # Groups: read+parse 3 workers x 1 slot, transform 2: 5 of 6 slots; one is free. Counted
    # once per stage it would be 3 x 0.5 + 3 + 2 = 6.5, over the budget already.
    state = encode(_observation(), MemoryEstimator(), worker_cpu=WORKER_CPU)
    allowed = _allowed(state)
    assert allowed["add 1 worker to transform"] == (3, 3, 3)
    assert not any(label.startswith("add 2") for label in allowed)


def test_every_allocation_it_allows_fits_the_budget_the_control_plane_checks():
    observation = _observation()
    state = encode(observation, MemoryEstimator(), worker_cpu=WORKER_CPU)
    stages = [StageBudget(name, worker_cpu=c) for name, c in WORKER_CPU.items()]
    groups = group_budgets(LAYOUT, stages)
    names = [s.name for s in observation.stages]
    assert len(state.allocations) > 3
    for allocation in state.allocations.values():
        workers = group_workers(
            dict(zip(names, allocation, strict=True)), observation.allocation, LAYOUT
        )
        assert allocation_problems(workers, groups, HostBudget(6, cpus=6.0)) == []


def test_without_a_layout_each_stage_counts_its_own_workers():
    observation = _observation(layout=None)
    state = encode(observation, MemoryEstimator(), worker_cpu=WORKER_CPU)
    # 3 x 0.5 + 3 + 2 = 6.5 slots: nothing may be added.
    assert not any(label.startswith("add") for label in _allowed(state))
