"""A decision, online learning and the capacity fit included, takes under 5 ms on a CPU, even for
16 stages.

Measured robustly on a shared machine: the CPU time of the deciding thread (time the thread was
not running does not count), and the median over a block of decisions (a slow decision now and
then, a garbage collection, does not count). Other work on the same cores still slows a running
thread (shared caches, a busy sibling hyperthread), in bursts; so the decisions are measured in
blocks, and the test asks that some block's median be under 5 ms, measuring more blocks, up to a
bound, while none is. A decision that really takes 5 ms or more fails every block.
"""

import time

import numpy as np
from helpers import make_scenario

from tuner.control import make_tuner
from tuner.twin import PipelineTwin

TARGET_S = 0.005
BLOCK = 25
WARMUP = 20
MOST_BLOCKS = 16


def test_median_decision_cpu_time_is_under_5_ms_for_16_stages():
    stages = [
        {"name": f"s{i}", "us_per_sample": 1.0 + i, "memory_mb_per_worker": 64} for i in range(16)
    ]
    scenario = make_scenario(stages, cpus=64, memory_gb=256, noise=0.02)
    tuner = make_tuner("intune", scenario.stage_names)
    twin = PipelineTwin(scenario)
    observation = twin.reset()

    def decide_and_time() -> float:
        nonlocal observation
        started = time.thread_time()
        decision = tuner.decide(observation)
        elapsed = time.thread_time() - started
        observation = twin.step(decision.allocation).observation
        return elapsed

    for _ in range(WARMUP):
        decide_and_time()
    medians = []
    while len(medians) < MOST_BLOCKS:
        medians.append(float(np.median([decide_and_time() for _ in range(BLOCK)])))
        if len(medians) >= 4 and min(medians) < TARGET_S:
            break
    assert tuner.learn_steps > 50  # the timing includes online learning
    assert tuner.uses_capacity_fit
    assert min(medians) < TARGET_S, (
        f"the median CPU time per decision was {1e3 * min(medians):.2f} ms in the best of "
        f"{len(medians)} blocks of {BLOCK} (all: {[round(1e3 * m, 2) for m in medians]} ms); "
        "profile IntuneTuner.decide (python -m cProfile) to see what grew"
    )
