"""A worker held back from a CPU by other work on the host (on the run queue) wanted that CPU:
the budget counts it as a worker that computes, not as one that waits, so a loaded host is not
oversubscribed. This was the two-rank torchrun test's failure inside the full suite: the decode
stage's workers, held back by the suite's other processes, read as waiting workers, and the
tuner gave them more workers than the host had CPUs."""

import pytest

from agents.budget import (
    HostBudget,
    StageBudget,
    WorkerCpuMeter,
    allocation_problems,
    cpu_per_busy_worker,
    relative_cpu_per_busy_worker,
)


def held_back(runqueue_percent: float | None) -> list[dict]:
    """A decode stage of 2 processes busy 95% of the time on a host loaded by other work: they
    got 0.4 of a CPU each (76%) and waited for one the rest of their busy time (114%); beside
    it, a fetch stage whose 8 threads wait on I/O (30% CPU, 6% on the run queue)."""
    decode = {"name": "decode", "workers": 2, "busy_fraction": 0.95, "cpu_percent": 76.0}
    fetch = {"name": "fetch", "workers": 8, "busy_fraction": 0.9, "cpu_percent": 30.0}
    if runqueue_percent is not None:
        decode["runqueue_percent"] = runqueue_percent
        fetch["runqueue_percent"] = 6.0
    return [decode, fetch]


def costs(stages: list[dict], host_cpu_percent: float = 80.0) -> dict[str, float]:
    meter = WorkerCpuMeter()
    for _ in range(5):
        meter.update(stages, host_cpu_percent)
    return meter.worker_cpu()


def test_time_on_the_run_queue_counts_as_cpu_the_worker_wanted():
    assert cpu_per_busy_worker(76.0, 2, 0.95) == pytest.approx(0.4)
    assert cpu_per_busy_worker(76.0, 2, 0.95, runqueue_percent=114.0) == pytest.approx(1.0)
    # Not measured (an older agent, a kernel without schedstat): as before.
    assert cpu_per_busy_worker(76.0, 2, 0.95, runqueue_percent=0.0) == pytest.approx(0.4)
    assert cpu_per_busy_worker(0.0, 2, 0.95, runqueue_percent=114.0) is None


def test_a_computing_stage_held_back_by_the_load_takes_a_whole_slot_per_worker():
    assert costs(held_back(None))["decode"] == pytest.approx(0.4), "the old reading: it waits"
    measured = costs(held_back(114.0))
    assert measured["decode"] == 1.0
    # The stage whose threads wait on I/O still waits, and costs the CPU it used (its time on
    # the run queue is the load's): 0.04 CPU per busy thread.
    assert measured["fetch"] == pytest.approx(30.0 / 100 / (8 * 0.9))


def test_the_run_queue_reading_keeps_the_host_from_being_oversubscribed():
    host = HostBudget(cpu_slots=4, cpus=2)  # 2 CPUs, 2 stages
    allocation = {"decode": 6, "fetch": 8}
    misread = [StageBudget(n, worker_cpu=c) for n, c in costs(held_back(None)).items()]
    assert allocation_problems(allocation, misread, host) == [], "6 decoders on 2 CPUs 'fit'"
    measured = [StageBudget(n, worker_cpu=c) for n, c in costs(held_back(114.0)).items()]
    (problem,) = allocation_problems(allocation, measured, host)
    assert "decode 6 x 1" in problem and "host budget is 4 CPU slots" in problem


def test_the_relative_reading_of_a_saturated_host_includes_the_run_queue():
    relative = relative_cpu_per_busy_worker(held_back(114.0), host_cpu_percent=100.0)
    assert relative["decode"] == 1.0
    assert relative["fetch"] < 0.5


def test_a_waiting_stage_on_a_loaded_host_costs_the_cpu_it_used_not_its_wake_up_delays():
    # 4 threads that sleep 20 ms an item, beside threads that spin, on a loaded host:
    # they used 3% of a CPU each and were runnable 40% of their busy time (wake-ups, the GIL).
    fetch = {"name": "fetch", "workers": 4, "busy_fraction": 0.99, "cpu_percent": 12.0,
             "runqueue_percent": 160.0}  # fmt: skip
    assert costs([fetch])["fetch"] == pytest.approx(0.12 / 3.96)
    # Runnable more than half the time: it computes, held back.
    fetch["runqueue_percent"] = 200.0
    assert costs([fetch])["fetch"] == 1.0
