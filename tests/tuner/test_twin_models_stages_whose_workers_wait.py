"""The twin's stages whose workers wait: throughput grows with workers over their latency, at
little CPU each, nearly untouched by a crowded CPU; the twin measures their CPU like an agent."""

import pytest
from helpers import make_scenario

from tuner.model import cpu_share, stage_rates, throughput, worker_demand
from tuner.optimum import brute_force_optimum, optimum
from tuner.twin import PipelineTwin

FETCH = {"name": "fetch", "us_per_sample": 500.0, "wait_us_per_sample": 19_500.0}
DECODE = {"name": "decode", "us_per_sample": 2_000.0}


def test_a_waiting_worker_delivers_one_sample_per_latency_at_a_fortieth_of_a_cpu():
    scenario = make_scenario([FETCH, DECODE], cpus=2)
    host = scenario.host_at(0)
    assert worker_demand(scenario.stages[0]) == pytest.approx(0.025)
    # 10 fetch workers ask for 0.25 CPU, 1 decoder for 1: share 1. Fetch: 10 / 20 ms = 500/s.
    assert stage_rates(scenario, host, [10, 1]) == pytest.approx([500.0, 500.0])
    assert throughput(scenario, host, [20, 1]) == pytest.approx(500.0)  # decode binds now


def test_a_crowded_cpu_slows_a_waiting_stage_far_less_than_a_computing_one():
    scenario = make_scenario([FETCH, DECODE], cpus=1)
    host = scenario.host_at(0)
    # 40 x 0.025 + 3 x 1 = 4 CPUs asked of 1: share 0.25.
    assert cpu_share(scenario, host, [40, 3]) == pytest.approx(0.25)
    fetch, decode = stage_rates(scenario, host, [40, 3])
    assert fetch == pytest.approx(40 * 1e6 / (19_500 + 500 / 0.25))  # 86% of unhindered
    assert decode == pytest.approx(3 * 0.25 * 1e6 / 2_000)  # a quarter of unhindered


def test_the_twin_measures_a_waiting_stages_cpu_as_an_agent_would():
    twin = PipelineTwin(make_scenario([FETCH, DECODE], cpus=4))
    observation = twin.step({"fetch": 8, "decode": 2}).observation
    fetch, decode = observation.stages
    # Fetch: 8 workers at 50/s each = 400/s, all busy, 0.025 CPU each. Decode: busy 0.4.
    assert fetch.busy_fraction == pytest.approx(1.0)
    assert fetch.cpu_percent == pytest.approx(100 * 8 * 0.025)
    assert decode.cpu_percent == pytest.approx(100 * 2 * 0.4)


def test_the_twin_accepts_more_threads_than_slots_for_a_waiting_stage_up_to_64():
    twin = PipelineTwin(make_scenario([FETCH, DECODE], cpus=2))  # 4 CPU slots
    assert twin.step({"fetch": 30, "decode": 2}).refused is None
    assert "at most 64" in twin.step({"fetch": 65, "decode": 1}).refused
    assert "host budget is 4 CPU slots" in twin.step({"fetch": 1, "decode": 4}).refused


@pytest.mark.parametrize("cpus", [1, 2, 3])
def test_the_optimum_with_a_waiting_stage_equals_a_search_of_every_allocation(cpus):
    stages = [
        {**FETCH, "max_workers": 40},
        {**DECODE, "scaling": 0.9},
        {"name": "pack", "us_per_sample": 700.0, "memory_mb_per_worker": 300.0},
    ]
    scenario = make_scenario(stages, cpus=cpus, memory_gb=1.0)
    host = scenario.host_at(0)
    fast, slow = optimum(scenario, host), brute_force_optimum(scenario, host)
    assert fast.throughput == pytest.approx(slow.throughput, rel=1e-9)
    assert fast.allocation[0] > host.worker_budget  # more fetch threads than CPU slots
