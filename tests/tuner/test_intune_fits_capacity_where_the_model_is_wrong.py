"""InTune's online capacity fit (:mod:`tuner.capacity`): it recognises a stage that follows the
Universal Scalability Law, leaves stages the power law describes alone, forgets a pipeline that
changed under it, and so takes intune past ``prior`` where the capacity model is wrong."""

import numpy as np
import pytest
from helpers import make_scenario

from tuner.balance import water_fill
from tuner.capacity import CapacityFit
from tuner.control import make_tuner
from tuner.observation import HostObservation, Observation, StageObservation
from tuner.optimum import optimum
from tuner.twin import PipelineTwin


def _observation(workers: int, capacity: float, cpus: float = 64.0) -> Observation:
    stage = StageObservation(
        name="s", workers=workers, items_per_s=capacity, busy_fraction=1.0, queue_fill=0.5
    )
    host = HostObservation(
        cpus=cpus, cpu_percent=50.0, memory_limit_mb=1e6, memory_used_mb=1.0, worker_budget=80
    )
    return Observation(stages=[stage], host=host, throughput=capacity, trainer_idle_fraction=0.0)


def _usl(w: int, sigma: float, kappa: float) -> float:
    return 1000.0 * w / (1 + sigma * (w - 1) + kappa * w * (w - 1))


def test_the_fit_recovers_a_stage_that_follows_the_law():
    fit = CapacityFit()
    rng = np.random.default_rng(0)
    for w in [1, 20, 14, 10, 12, 8, 9, 11, 10, 12] * 2:
        noisy = _usl(w, 0.08, 0.01) * (1 + rng.normal(0, 0.02))
        fit.update(_observation(w, noisy), {"s": 1.0})
    sigma, kappa = fit.usl()["s"]
    assert sigma == pytest.approx(0.08, abs=0.05) and kappa == pytest.approx(0.01, abs=0.004)


def test_the_fit_leaves_a_power_law_stage_to_the_prior():
    fit = CapacityFit()
    rng = np.random.default_rng(1)
    for w in [1, 20, 14, 10, 12, 8, 9, 11, 10, 12] * 2:
        fit.update(_observation(w, 1000.0 * w**0.8 * (1 + rng.normal(0, 0.03))), {"s": 1.0})
    assert fit.usl() == {}


def test_the_fit_forgets_a_pipeline_that_changed_under_it():
    fit = CapacityFit()
    for w in [1, 20, 14, 10, 12, 8]:
        fit.update(_observation(w, _usl(w, 0.08, 0.01)), {"s": 1.0})
    assert "s" in fit.usl()
    # Co-located work takes CPUs the agent does not see: the same 8 workers make 30% less.
    fit.update(_observation(8, 0.7 * _usl(8, 0.08, 0.01)), {"s": 1.0})
    assert fit.usl() == {} and list(fit.points["s"]) == [8]


def test_water_fill_stops_a_stage_at_its_peak():
    # Stage 0 peaks near 10 workers; the prior's power law would give it all 40 slots' share.
    law = [(0.08, 0.01), (0.0, 0.0)]
    plain = water_fill([1000.0, 100_000.0], [64, 64], 40)
    fitted = water_fill([1000.0, 100_000.0], [64, 64], 40, usl=law)
    assert plain == (39, 1)
    assert fitted == (10, 1)


def test_intune_beats_prior_on_a_stage_past_its_peak_and_prior_gains_nothing_from_it():
    scenario = make_scenario(
        [
            {"name": "read", "us_per_sample": 4.0},
            {"name": "parse", "us_per_sample": 40.0, "serial_fraction": 0.1, "coherency": 0.01},
            {"name": "collate", "us_per_sample": 6.0},
        ],
        cpus=32,
        noise=0.02,
    )
    best = optimum(scenario, scenario.host_at(0)).throughput
    final = {}
    for name in ("prior", "intune"):
        tuner = make_tuner(name, scenario.stage_names, seed=0)
        twin = PipelineTwin(scenario, seed=0)
        observation = twin.reset()
        values = []
        for _ in range(60):
            result = twin.step(tuner.decide(observation).allocation)
            observation = result.observation
            values.append(result.throughput)
        final[name] = np.mean(values[-10:]) / best
        if name == "prior":
            assert tuner.capacity.points == {}  # prior never fits: that is learning
    assert final["prior"] < 0.85
    assert final["intune"] > 0.95
