"""intune remembers an allocation the host refused and stops asking for it (:mod:`tuner.refusals`).

The twin: a stage whose wait per sample grows with its workers (``wait_growth``), so its threads
measure less CPU each as it grows, while the budget counts each at the CPU of a worker running
unhindered. The tuner's mask then lets through the whole budget's worth of threads, the budget
refuses it, and a tuner that does not remember asks again at every decision while the allocation
in force stays where it was.
"""

import numpy as np
from helpers import make_scenario

from tuner.control import dumps, loads, make_tuner
from tuner.model import check_allocation
from tuner.observation import HostObservation, Observation, StageObservation
from tuner.optimum import optimum
from tuner.refusals import MEMORY, Refusals
from tuner.twin import PipelineTwin

WAITING = make_scenario(
    [
        {
            "name": "read",
            "us_per_sample": 115.0,
            "wait_us_per_sample": 916.0,
            "wait_growth": 0.164,
            "memory_mb_per_worker": 100,
        },
        {
            "name": "decompress",
            "us_per_sample": 22.0,
            "max_workers": 2,
            "memory_mb_per_worker": 100,
        },
    ],
    cpus=6,
    noise=0.007,
)


def final_over_optimum(name, seed, steps=40, **options):
    tuner = make_tuner(name, WAITING.stage_names, seed=seed, **options)
    twin = PipelineTwin(WAITING, seed=seed)
    observation, throughputs, refused = twin.reset(), [], 0
    for _ in range(steps):
        allocation = tuner.decide(observation).allocation
        refused += (
            check_allocation(WAITING, WAITING.host_at(0), twin.allocation_vector(allocation))
            is not None
        )
        result = twin.step(allocation)
        observation = result.observation
        throughputs.append(result.throughput)
    best = optimum(WAITING, WAITING.host_at(0)).throughput
    return float(np.mean(throughputs[-10:])) / best, refused


def test_intune_beats_prior_where_prior_keeps_asking_for_a_refused_allocation():
    for seed in range(3):
        intune, intune_refused = final_over_optimum("intune", seed)
        prior, prior_refused = final_over_optimum("prior", seed)
        without, _ = final_over_optimum("intune", seed, remember_refusals=False)
        # Measured 2026-11-25: intune 0.989 to 0.991, prior and intune without it 0.966.
        assert intune >= 1.015 * prior, (seed, intune, prior)
        assert without < 1.005 * prior, (seed, without, prior)
        assert prior_refused > 30 and intune_refused <= 3, (prior_refused, intune_refused)


def observation(workers, throughput=1000.0, cpus=6.0, budget=8):
    return Observation(
        stages=[
            StageObservation(
                name=n, workers=w, items_per_s=throughput, busy_fraction=1.0, queue_fill=0.5
            )
            for n, w in zip(("read", "decompress"), workers, strict=True)
        ],
        host=HostObservation(
            cpus=cpus,
            cpu_percent=50.0,
            memory_limit_mb=1e5,
            memory_used_mb=1.0,
            worker_budget=budget,
        ),
        throughput=throughput,
        trainer_idle_fraction=0.0,
    )


def key(workers):
    return ((), tuple(workers))


def test_a_refusal_masks_every_allocation_with_at_least_its_workers_and_is_forgotten_later():
    refusals = Refusals()
    refusals.update(observation((44, 1)), key((44, 1)))
    refusals.request(key((64, 1)), key((44, 1)))
    assert refusals.update(observation((44, 1)), key((44, 1)))
    allocations = {0: (44, 1), 1: (64, 1), 2: (64, 2), 3: (63, 2), 4: (55, 1)}
    mask = np.ones(5, dtype=bool)
    refusals.mask((), allocations, mask)
    # Hold stays allowed; (63, 2) has fewer read workers than the refused (64, 1).
    assert mask.tolist() == [True, False, False, True, True]
    for _ in range(MEMORY):
        refusals.update(observation((44, 1)), key((44, 1)))
    mask = np.ones(5, dtype=bool)
    refusals.mask((), allocations, mask)
    assert mask.all()


def test_a_refusal_is_forgotten_when_the_host_changes_and_never_learnt_from_an_oom_step():
    refusals = Refusals()
    refusals.update(observation((44, 1)), key((44, 1)))
    refusals.request(key((64, 1)), key((44, 1)))
    assert not refusals.update(observation((44, 1), throughput=0.0), key((44, 1)))
    refusals.request(key((64, 1)), key((44, 1)))
    assert refusals.update(observation((44, 1)), key((44, 1)))
    refusals.update(observation((44, 1), budget=12, cpus=10.0), key((44, 1)))
    assert refusals.refused == {}


def test_a_checkpoint_keeps_what_was_refused():
    tuner = make_tuner("intune", WAITING.stage_names, seed=0)
    twin = PipelineTwin(WAITING, seed=0)
    obs = twin.reset()
    for _ in range(3):
        obs = twin.step(tuner.decide(obs).allocation).observation
    assert tuner.refusals.refused
    restored = loads(dumps(tuner))
    assert restored.refusals.refused == tuner.refusals.refused
    for _ in range(10):
        a, b = tuner.decide(obs), restored.decide(obs)
        assert a.allocation == b.allocation and a.q_values == b.q_values
        obs = twin.step(a.allocation).observation
