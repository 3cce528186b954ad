"""The budget limits what is scarce: a worker that computes takes one CPU slot, a worker that
waits takes only the CPU it was measured to use, so a waiting stage may grow past one worker per
CPU (up to 64) while a computing stage may not. Checked at and below one CPU."""

import pytest

from agents.budget import (
    MAX_WAITING_WORKERS,
    HostBudget,
    StageBudget,
    WorkerCpuMeter,
    allocation_problems,
    cpu_slots,
    most_workers,
)


def measured(fetch_cpu_percent: float, host_cpu_percent: float = 40.0) -> dict[str, float]:
    """Slots per worker after a few seconds of a fetch stage (4 threads, busy 95% of the time)
    beside a decode stage (1 process, busy 80%, computing)."""
    meter = WorkerCpuMeter()
    for _ in range(5):
        meter.update(
            [
                {"name": "fetch", "workers": 4, "busy_fraction": 0.95,
                 "cpu_percent": fetch_cpu_percent},
                {"name": "decode", "workers": 1, "busy_fraction": 0.8, "cpu_percent": 78.0},
            ],
            host_cpu_percent,
        )  # fmt: skip
    return meter.worker_cpu()


def stages(worker_cpu: dict[str, float]) -> list[StageBudget]:
    return [StageBudget(name, worker_cpu=worker_cpu.get(name, 1.0)) for name in ("fetch", "decode")]


def test_a_stage_that_waits_takes_the_cpu_one_busy_worker_used():
    costs = measured(fetch_cpu_percent=7.6)  # 0.076 CPU over 3.8 busy workers: 0.02 each
    assert costs["fetch"] == pytest.approx(0.02)
    assert costs["decode"] == 1.0  # 0.78 / 0.8 = 0.975 of a CPU: it computes


def test_a_stage_that_was_not_measured_takes_a_whole_slot_per_worker():
    assert WorkerCpuMeter().worker_cpu() == {}
    meter = WorkerCpuMeter()
    # Hardly busy, or no CPU reading at all: nothing is learnt.
    meter.update([{"name": "fetch", "workers": 4, "busy_fraction": 0.01, "cpu_percent": 1.0}], 10)
    meter.update([{"name": "fetch", "workers": 4, "busy_fraction": 0.9, "cpu_percent": 0.0}], 10)
    assert meter.worker_cpu() == {}
    assert StageBudget("fetch").worker_cpu == 1.0


def test_on_half_a_cpu_many_threads_of_a_waiting_stage_fit_but_a_second_decoder_does_not():
    host = HostBudget(cpu_slots(0.5, 2), cpus=0.5)  # one whole slot plus one per stage: 3
    assert host.cpu_slots == 3
    budget = stages(measured(fetch_cpu_percent=7.6))
    assert allocation_problems({"fetch": 40, "decode": 2}, budget, host) == []
    problems = allocation_problems({"fetch": 1, "decode": 3}, budget, host)
    assert len(problems) == 1 and "takes 3.02 CPU slots" in problems[0]
    assert "the host budget is 3 CPU slots (0.5 CPUs)" in problems[0]


def test_at_one_cpu_a_computing_stage_still_counts_one_slot_per_worker():
    host = HostBudget(cpu_slots(1.0, 2), cpus=1.0)  # 3 slots
    unmeasured = stages({})
    assert allocation_problems({"fetch": 2, "decode": 1}, unmeasured, host) == []
    assert allocation_problems({"fetch": 3, "decode": 1}, unmeasured, host)
    budget = stages(measured(fetch_cpu_percent=7.6))
    assert most_workers(budget[0], budget, host) == MAX_WAITING_WORKERS
    assert most_workers(budget[1], budget, host) == 2  # 3 slots less fetch's 0.02, whole workers


def test_a_waiting_stage_may_not_pass_64_workers_however_cheap():
    host = HostBudget(cpu_slots(128.0, 2), cpus=128.0)
    budget = stages(measured(fetch_cpu_percent=7.6))
    problems = allocation_problems({"fetch": 65, "decode": 1}, budget, host)
    assert problems and "at most 64" in problems[0]
    assert allocation_problems({"fetch": 64, "decode": 1}, budget, host) == []


def test_on_a_saturated_host_time_slicing_is_not_mistaken_for_waiting():
    # The CPUs are all busy: decode's one worker gets 0.3 of a CPU, fetch's 0.006 each.
    meter = WorkerCpuMeter()
    meter.update(
        [
            {"name": "fetch", "workers": 4, "busy_fraction": 1.0, "cpu_percent": 2.4},
            {"name": "decode", "workers": 1, "busy_fraction": 1.0, "cpu_percent": 30.0},
        ],
        host_cpu_percent=99.0,
    )
    costs = meter.worker_cpu()
    assert costs["decode"] == 1.0  # its 0.3 is its share of a crowded CPU, not waiting
    assert costs["fetch"] == pytest.approx(0.02)  # 0.006 / 0.3: it waits next to decode


def test_the_agent_lets_waiting_workers_run_a_little_over_what_the_control_plane_saw():
    host = HostBudget(3)
    budget = stages({"fetch": 0.1})
    allocation = {"fetch": 11, "decode": 2}  # 2 + 1.1 = 3.1 slots
    assert allocation_problems(allocation, budget, host)
    assert allocation_problems(allocation, budget, host, waiting_tolerance=0.2) == []
