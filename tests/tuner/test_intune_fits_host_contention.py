"""InTune's host contention fit (:class:`tuner.capacity.HostContentionFit`): it recovers a law
by which every stage slows with the pipeline's TOTAL workers, leaves a stage that its own power
law describes to the prior, and so takes intune past ``prior`` where stages contend for the
host's memory bandwidth (the held-out ``contention`` twins of tuner.generate)."""

from pathlib import Path

import numpy as np
import pytest

from tuner.balance import peak_total
from tuner.capacity import HostContentionFit
from tuner.control import make_tuner
from tuner.intune import IntuneConfig, IntuneTuner
from tuner.observation import HostObservation, Observation, StageObservation
from tuner.optimum import optimum
from tuner.scenario import load_suite
from tuner.twin import PipelineTwin

SUITE = Path(__file__).resolve().parents[2] / "tuner" / "suites" / "contention_holdout.json"


def _observation(rates: dict[str, float], workers: dict[str, int]) -> Observation:
    stages = [
        StageObservation(name, workers[name], rate, busy_fraction=1.0, queue_fill=0.5)
        for name, rate in rates.items()
    ]
    host = HostObservation(
        cpus=256.0, cpu_percent=50.0, memory_limit_mb=1e6, memory_used_mb=1.0, worker_budget=300
    )
    return Observation(stages, host, throughput=min(rates.values()), trainer_idle_fraction=0.0)


def _feed(fit: HostContentionFit, capacity, seed: int) -> None:
    """Stage "s" keeps 2 workers while "other" sweeps the total from 3 to 60."""
    rng = np.random.default_rng(seed)
    for other in [1, 40, 20, 10, 30, 5, 50, 15, 25, 58] * 2:
        workers = {"s": 2, "other": other}
        total = 2 + other
        rates = {
            name: capacity(w, total) * (1 + rng.normal(0, 0.02)) for name, w in workers.items()
        }
        fit.update(_observation(rates, workers), {"s": 1.0, "other": 1.0})


def test_the_fit_recovers_a_known_contention_law_on_the_total_workers():
    fit = HostContentionFit()
    _feed(
        fit, lambda w, total: 1000.0 * w / (1 + 0.05 * (total - 1) + 0.001 * total * (total - 1)), 0
    )
    sigma, kappa = fit.usl()["s"]
    assert sigma == pytest.approx(0.05, abs=0.02) and kappa == pytest.approx(0.001, abs=0.0005)


def test_the_gate_stays_closed_where_the_stage_follows_its_own_power_law():
    fit = HostContentionFit()
    # Capacity depends on the stage's own workers only (w ** 0.8): the total says nothing.
    _feed(fit, lambda w, total: 1000.0 * w**0.8, 1)
    assert fit.usl() == {}


def test_the_gate_stays_closed_where_a_stage_grows_with_the_total_by_a_power_law():
    fit = HostContentionFit()
    rng = np.random.default_rng(2)
    for w in [1, 20, 14, 10, 12, 8, 9, 11, 10, 12] * 2:
        workers = {"s": w, "other": 2 * w}
        rates = {"s": 1000.0 * w**0.7 * (1 + rng.normal(0, 0.03)), "other": 1000.0 * 2 * w}
        fit.update(_observation(rates, workers), {"s": 1.0, "other": 1.0})
    assert fit.usl() == {}


def test_the_peak_total_is_where_the_balanced_pipeline_is_fastest():
    names = ["a", "b"]
    law = {"a": (0.0, 0.002), "b": (0.0, 0.002)}
    per_worker = np.array([1000.0, 500.0])
    peak = peak_total(per_worker, law, names, 2, 200, cpus=256.0)
    # min(W, cpus) / (1 + kappa W (W - 1)) peaks at W = sqrt(1 / kappa), about 22.
    assert 18 <= peak <= 24
    assert peak_total(per_worker, {}, names, 2, 200, cpus=256.0) == 200


def _final(tuner, scenario, seed: int) -> float:
    twin = PipelineTwin(scenario, seed=seed)
    observation = twin.reset()
    values = []
    for _ in range(80):
        result = twin.step(tuner.decide(observation).allocation)
        observation = result.observation
        values.append(result.throughput)
    return float(np.mean(values[-10:]))


def test_intune_beats_prior_where_the_stages_contend_and_the_fit_is_what_does_it():
    # A held-out contention twin (tuner.generate.contention_suite): 5 stages, 9 CPUs, every
    # stage memory-bound, bandwidth for about one worker's worth.
    (scenario,) = [s for s in load_suite(SUITE) if s.name == "contention-holdout-00"]
    best = optimum(scenario, scenario.host_at(0)).throughput
    names = scenario.stage_names
    prior = _final(make_tuner("prior", names, seed=0), scenario, 0) / best
    intune = make_tuner("intune", names, seed=0)
    with_fit = _final(intune, scenario, 0) / best
    without = IntuneTuner(names, IntuneConfig(host_contention_fit=False), seed=0)
    without.load_policy(intune.policy_dict())
    assert intune.contention.usl()  # the gate opened
    assert with_fit > 0.95 and with_fit > 1.05 * prior
    assert with_fit > 1.05 * _final(without, scenario, 0) / best
