"""The tuner's action mask counts CPU slots as the agent does (agents.budget): a stage whose
workers were measured waiting may get more threads than the host has CPUs, a computing stage
may not; and InTune, pretrained on twins, finds the optimum of an I/O-bound twin."""

import numpy as np
import pytest
from helpers import make_scenario

from agents.budget import WorkerCpuMeter
from tuner.actions import encode, measure_worker_cpu
from tuner.bench import run_one
from tuner.memory import MemoryEstimator
from tuner.scenario import load_suite
from tuner.twin import PipelineTwin

FETCH = {"name": "fetch", "us_per_sample": 500.0, "wait_us_per_sample": 19_500.0}
DECODE = {"name": "decode", "us_per_sample": 2_000.0}


def allowed_allocations(scenario, allocation):
    twin = PipelineTwin(scenario)
    observation = twin.step(allocation).observation
    meter = WorkerCpuMeter()
    worker_cpu = measure_worker_cpu(meter, observation)
    memory = MemoryEstimator()
    memory.update(observation)
    state = encode(observation, memory, worker_cpu=worker_cpu)
    return worker_cpu, [state.allocations[i] for i in np.flatnonzero(state.mask)]


def test_a_waiting_stage_may_be_given_more_threads_than_the_host_has_cpus():
    scenario = make_scenario([FETCH, DECODE], cpus=2)  # 4 CPU slots
    worker_cpu, allowed = allowed_allocations(scenario, {"fetch": 4, "decode": 1})
    assert worker_cpu["fetch"] == pytest.approx(0.025) and worker_cpu["decode"] == 1.0
    most_fetch = max(a[0] for a in allowed)
    assert most_fetch > 4, f"fetch never gets past one thread per slot: {allowed}"
    assert all(a[1] <= 3 for a in allowed), "decode takes a whole slot per worker"
    assert all(a[0] * 0.025 + a[1] <= 4 + 1e-9 for a in allowed)


def test_the_same_stage_measured_computing_gets_no_more_than_the_slots():
    computing = make_scenario([{**FETCH, "wait_us_per_sample": 0.0}, DECODE], cpus=2)
    worker_cpu, allowed = allowed_allocations(computing, {"fetch": 2, "decode": 1})
    assert worker_cpu == {"fetch": 1.0, "decode": 1.0}
    assert max(sum(a) for a in allowed) == 4


def test_the_control_planes_worker_cpu_is_used_as_given():
    scenario = make_scenario([FETCH, DECODE], cpus=2)
    observation = PipelineTwin(scenario).step({"fetch": 4, "decode": 1}).observation
    observation.stages[0].worker_cpu = 0.5  # the control plane counts fetch at half a slot
    worker_cpu = measure_worker_cpu(WorkerCpuMeter(), observation)
    assert worker_cpu["fetch"] == 0.5


@pytest.mark.parametrize("name", ["object-store-2c", "object-store-16c"])
def test_intune_reaches_the_optimum_of_an_io_bound_twin_within_a_few_steps(name):
    scenario = {s.name: s for s in load_suite("tuner/suites/io_bound.json")}[name]
    _, metrics = run_one(scenario, "intune", seed=0, steps=25)
    assert metrics.final_vs_optimum > 0.95
    assert metrics.steps_to_95 is not None and metrics.steps_to_95 <= 10
