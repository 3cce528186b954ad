"""The twin's keys where the tuners' capacity model is wrong (issue 15) change its throughput the
way they claim: Universal Scalability Law scaling, memory bandwidth shared between stages, wait
that grows with workers and a consumer whose rate changes; the exact optimum stays exact."""

import pytest
from helpers import make_scenario

from tuner.model import bandwidth_slowdown, cpu_share, stage_rates, throughput
from tuner.optimum import brute_force_optimum, optimum
from tuner.scenario import load_suite, scenario_from_dict, scenario_to_dict
from tuner.twin import PipelineTwin


def test_serial_fraction_and_coherency_follow_the_universal_scalability_law():
    stage = {"name": "s", "us_per_sample": 100.0, "serial_fraction": 0.1, "coherency": 0.02}
    scenario = make_scenario([stage], cpus=64)
    host = scenario.host_at(0)
    one = 1e6 / 100.0
    for w in (1, 2, 5, 20):
        expected = one * w / (1 + 0.1 * (w - 1) + 0.02 * w * (w - 1))
        assert stage_rates(scenario, host, [w])[0] == pytest.approx(expected)
    # Past the peak (about sqrt(0.9 / 0.02) = 6.7 workers) more workers make less.
    rates = [throughput(scenario, host, [w]) for w in range(1, 21)]
    assert max(range(20), key=lambda i: rates[i]) + 1 in (6, 7)
    assert rates[19] < rates[6] * 0.75
    plain = make_scenario([{"name": "s", "us_per_sample": 100.0}], cpus=64)
    assert throughput(plain, plain.host_at(0), [20]) == pytest.approx(20 * one)


def test_memory_bandwidth_makes_one_stages_workers_slow_the_others():
    stages = [
        {"name": "a", "us_per_sample": 100.0, "memory_bound": 0.5},
        {"name": "b", "us_per_sample": 100.0, "memory_bound": 1.0},
    ]
    raw = scenario_to_dict(make_scenario(stages, cpus=64))
    raw["host"]["memory_bandwidth"] = 4.0
    scenario = scenario_from_dict(raw)
    host = scenario.host_at(0)
    # 2 x 0.5 + 2 x 1 = 3 workers' worth of bandwidth of 4: nothing slows.
    assert bandwidth_slowdown(scenario, [2, 2]) == 1.0
    assert stage_rates(scenario, host, [2, 2]) == pytest.approx([2e4, 2e4])
    # b at 6 workers asks 1 + 6 = 7 of 4: memory-bound time stretches 1.75 times, so a at the
    # same 2 workers loses capacity it did not ask to lose (half its time stretched).
    assert bandwidth_slowdown(scenario, [2, 6]) == pytest.approx(1.75)
    a, b = stage_rates(scenario, host, [2, 6])
    assert a == pytest.approx(2e6 / (100 * (0.5 + 0.5 * 1.75)))
    assert b == pytest.approx(6e6 / (100 * 1.75))
    # The stretched CPU time counts as CPU: with 8 CPUs, 2 + 6 workers take them all.
    small = scenario_from_dict({**raw, "host": {**raw["host"], "cpus": 8.0}})
    assert cpu_share(small, small.host_at(0), [2, 6]) == pytest.approx(1.0)
    without = scenario_from_dict({**raw, "host": {"cpus": 64.0, "memory_gb": 64.0}})
    assert stage_rates(without, without.host_at(0), [2, 6]) == pytest.approx([2e4, 6e4])


def test_wait_growth_makes_a_waiting_stage_add_less_with_each_worker():
    fetch = {"name": "fetch", "us_per_sample": 100.0, "wait_us_per_sample": 9_900.0}
    growing = make_scenario([{**fetch, "wait_growth": 0.1}], cpus=8)
    plain = make_scenario([fetch], cpus=8)
    for w in (1, 4, 16):
        wait = 9_900.0 * (1 + 0.1 * (w - 1))
        assert throughput(growing, growing.host_at(0), [w]) == pytest.approx(w * 1e6 / (wait + 100))
    assert throughput(growing, growing.host_at(0), [1]) == throughput(plain, plain.host_at(0), [1])
    # Unbounded workers approach 1 / (0.1 x 9.9 ms) = 1010/s, where plain ones grow linearly.
    assert throughput(growing, growing.host_at(0), [64]) < 1010
    assert throughput(plain, plain.host_at(0), [64]) == pytest.approx(6400)
    # The twin measures the longer wait as less CPU per busy worker, as an agent would.
    observation = PipelineTwin(growing).step([16]).observation
    share_of_cpu = 100.0 / (100.0 + 9_900.0 * 2.5)
    assert observation.stages[0].cpu_percent == pytest.approx(100 * 16 * share_of_cpu)


def test_an_event_changes_the_consumers_rate():
    stages = [{"name": "a", "us_per_sample": 100.0}]
    events = [{"at_step": 3, "consumer_samples_per_s": 5_000.0}]
    scenario = make_scenario(stages, cpus=8, consumer=20_000.0, events=events)
    assert throughput(scenario, scenario.host_at(2), [4]) == pytest.approx(20_000.0)
    assert throughput(scenario, scenario.host_at(3), [4]) == pytest.approx(5_000.0)
    assert optimum(scenario, scenario.host_at(3)).throughput == pytest.approx(5_000.0)
    # One worker makes 10,000/s: the trainer waits half the time, then not at all.
    twin = PipelineTwin(scenario)
    idle = [twin.step([1]).observation.trainer_idle_fraction for _ in range(4)]
    assert idle == pytest.approx([0.5, 0.5, 0.5, 0.0])
    assert scenario_from_dict(scenario_to_dict(scenario)) == scenario


@pytest.mark.parametrize(
    "traits",
    [
        {"coherency": 0.05, "serial_fraction": 0.2},
        {"memory_bound": 0.8},
        {"wait_growth": 0.3, "wait_us_per_sample": 900.0},
    ],
)
def test_the_optimum_stays_exact(traits):
    stages = [
        {"name": "a", "us_per_sample": 30.0, **traits},
        {"name": "b", "us_per_sample": 50.0, "memory_bound": 0.5},
        {"name": "c", "us_per_sample": 20.0},
    ]
    raw = scenario_to_dict(make_scenario(stages, cpus=10))
    raw["host"]["memory_bandwidth"] = 3.0
    scenario = scenario_from_dict(raw)
    host = scenario.host_at(0)
    exact, brute = optimum(scenario, host), brute_force_optimum(scenario, host)
    assert exact.throughput == pytest.approx(brute.throughput, rel=1e-9)


def test_the_model_wrong_suites_load_and_every_trait_appears():
    for name in ("model_wrong", "model_wrong_holdout"):
        suite = load_suite(f"tuner/suites/{name}.json")
        assert len(suite) >= 8
        stages = [s for scenario in suite for s in scenario.stages]
        assert any(s.coherency > 0 for s in stages)
        assert any(s.memory_bound > 0 for s in stages)
        assert any(s.wait_growth > 0 for s in stages)
        assert any(e.consumer_samples_per_s for sc in suite for e in sc.events)
        assert all(any(s.model_wrong for s in scenario.stages) for scenario in suite)
