"""On a host whose readings scatter by 10% (a shared machine; the twins' suites have 1-3%),
intune keeps the best allocation it measured instead of following each noisy predicted gain.

Before tuner/incumbent.py, intune changed its allocation in 22 to 24 of the last 30 decisions on
this twin (seeds 0-5) and averaged 0.90 of the optimum there; ``prior`` still does (23 to 26).
"""

import pytest
from helpers import make_scenario

from tuner.control import make_tuner
from tuner.optimum import optimum
from tuner.twin import PipelineTwin

NOISY = make_scenario(
    [
        {"name": "read", "us_per_sample": 2.0, "memory_mb_per_worker": 100},
        {"name": "parse", "us_per_sample": 9.0, "memory_mb_per_worker": 300},
        {"name": "transform", "us_per_sample": 5.0, "memory_mb_per_worker": 100},
        {"name": "collate", "us_per_sample": 3.0, "memory_mb_per_worker": 50},
    ],
    cpus=12,
    noise=0.10,
)
DECISIONS = 60
LATE = 30


def late_changes_and_throughput(tuner_name: str, seed: int) -> tuple[int, float]:
    tuner = make_tuner(tuner_name, NOISY.stage_names, seed=seed)
    twin = PipelineTwin(NOISY, seed=seed)
    observation = twin.reset()
    in_force, throughputs = [], []
    for _ in range(DECISIONS):
        result = twin.step(tuner.decide(observation).allocation)
        observation = result.observation
        in_force.append(result.allocation_in_force)
        throughputs.append(result.throughput)
    late = in_force[-LATE:]
    changes = sum(a != b for a, b in zip(late, late[1:], strict=False))
    best = optimum(NOISY, NOISY.host_at(0)).throughput
    return changes, sum(throughputs[-LATE:]) / LATE / best


@pytest.mark.parametrize("seed", range(4))
def test_intune_stops_dithering_and_stays_near_the_optimum_on_a_noisy_twin(seed):
    changes, throughput = late_changes_and_throughput("intune", seed)
    assert changes <= 15, f"intune changed its allocation {changes} times in {LATE} decisions"
    assert throughput >= 0.93, f"intune averaged {throughput:.3f} of the optimum"


def test_prior_without_the_measured_best_rules_still_dithers_there():
    # The control: the same model without tuner/incumbent.py's rules, so the twin is noisy
    # enough for the rules to matter.
    changes, _ = late_changes_and_throughput("prior", 0)
    assert changes >= 18
