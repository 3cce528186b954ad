"""The host's CPU slots are defined once (agents.budget.cpu_slots): whole CPUs, at least one,
plus one per stage, and every place that needs a default budget uses that definition."""

import pytest

from agents.budget import cpu_slots
from tuner.scenario import scenario_from_dict


@pytest.mark.parametrize(
    "cpus, stages, slots",
    [
        (16.0, 5, 21),
        (2.0, 4, 6),
        (1.5, 5, 6),
        (1.0, 2, 3),
        # Below one CPU the host still has one whole slot to split, plus one per stage.
        (0.5, 2, 3),
        (0.01, 1, 2),
    ],
)
def test_the_slots_are_whole_cpus_at_least_one_plus_one_per_stage(cpus, stages, slots):
    assert cpu_slots(cpus, stages) == slots


@pytest.mark.parametrize("cpus", [0.25, 0.5, 1.0, 1.5, 2.0, 7.9, 64.0])
def test_the_twin_defaults_to_the_same_slots_as_the_agent(cpus):
    stages = [{"name": f"s{i}", "us_per_sample": 1.0} for i in range(3)]
    scenario = scenario_from_dict(
        {"name": "t", "host": {"cpus": cpus, "memory_gb": 1}, "stages": stages}
    )
    assert scenario.host_at(0).worker_budget == cpu_slots(cpus, 3)
