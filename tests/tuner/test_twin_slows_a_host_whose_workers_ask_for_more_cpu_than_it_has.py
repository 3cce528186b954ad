"""The twin's ``oversubscription`` (issue 15): past the host's CPUs, time slicing costs CPU time,
so a computing stage's throughput falls with workers it has no CPU for; the bench's optimum
stays exact under it; and files without the key behave as before."""

import pytest
from helpers import make_scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.model import throughput
from tuner.optimum import brute_force_optimum, optimum
from tuner.scenario import scenario_from_dict, scenario_to_dict


def _one_stage(oversubscription: float):
    scenario = make_scenario([{"name": "fused", "us_per_sample": 10.0}], cpus=2)
    raw = scenario_to_dict(scenario)
    raw["host"]["oversubscription"] = oversubscription
    return scenario_from_dict(raw)


def test_a_computing_stage_falls_past_the_cores_and_only_with_the_key():
    costly, free = _one_stage(0.3), _one_stage(0.0)
    rates = {w: throughput(costly, costly.host_at(0), (w,)) for w in (1, 2, 3)}
    assert rates[1] < rates[2]
    assert rates[3] < rates[2]
    # 3 workers ask for 1.5 times the 2 CPUs: the CPUs lose 0.3 * 0.5 of their time.
    assert rates[3] == pytest.approx(rates[2] / 1.15)
    # Without it, time slicing is free: a third worker neither adds nor takes.
    assert throughput(free, free.host_at(0), (3,)) == pytest.approx(
        throughput(free, free.host_at(0), (2,))
    )
    assert "oversubscription" not in scenario_to_dict(free)["host"]
    assert scenario_to_dict(costly)["host"]["oversubscription"] == 0.3


def test_an_oversubscription_outside_0_to_1_is_refused_saying_so():
    raw = scenario_to_dict(_one_stage(0.0))
    raw["host"]["oversubscription"] = 1.5
    with pytest.raises(ValueError, match="'oversubscription' must be from 0 to 1"):
        scenario_from_dict(raw)


@settings(max_examples=60, deadline=None)
@given(
    oversubscription=st.floats(0.0, 1.0),
    cpus=st.integers(1, 6),
    costs=st.lists(st.floats(1.0, 30.0), min_size=2, max_size=3),
    waits=st.lists(st.sampled_from([0.0, 0.0, 20.0, 80.0]), min_size=3, max_size=3),
    caps=st.lists(st.sampled_from([None, None, 2, 4]), min_size=3, max_size=3),
)
def test_the_optimum_still_equals_a_search_of_every_allocation(
    oversubscription, cpus, costs, waits, caps
):
    stages = [
        {
            "name": f"s{i}",
            "us_per_sample": cost,
            "wait_us_per_sample": waits[i],
            "max_workers": caps[i],
        }
        for i, cost in enumerate(costs)
    ]
    raw = scenario_to_dict(make_scenario(stages, cpus=cpus))
    raw["host"]["oversubscription"] = oversubscription
    scenario = scenario_from_dict(raw)
    host = scenario.host_at(0)
    fast, slow = optimum(scenario, host), brute_force_optimum(scenario, host)
    assert fast.throughput == pytest.approx(slow.throughput, rel=1e-9)
