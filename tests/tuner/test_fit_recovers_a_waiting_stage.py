"""fit_scenario tells a stage whose workers wait from one that computes, from the CPU the
agent measured against the busy time, and recovers its CPU time and its wait per sample."""

import numpy as np
import pytest
from helpers import make_scenario

from tuner.control import fit_scenario
from tuner.twin import PipelineTwin

TRUE = make_scenario(
    [
        {"name": "fetch", "us_per_sample": 400.0, "wait_us_per_sample": 20_000.0},
        {"name": "decode", "us_per_sample": 3_000.0, "memory_mb_per_worker": 60},
    ],
    cpus=4,
    memory_gb=8,
    noise=0.01,
)


def protocol_sample(observation, seq: int) -> dict:
    """An Observation as the agent protocol's sample, CPU use per stage included."""
    host = observation.host
    return {
        "seq": seq,
        "host": {"cpus": host.cpus, "cpu_percent": host.cpu_percent,
                 "memory_used_mb": host.memory_used_mb, "memory_limit_mb": host.memory_limit_mb},
        "trainer": {"throughput": observation.throughput,
                    "idle_fraction": observation.trainer_idle_fraction},
        "stages": [
            {"name": s.name, "workers": s.workers, "items_per_s": s.items_per_s,
             "busy_fraction": s.busy_fraction, "cpu_percent": s.cpu_percent,
             "rss_mb": s.memory_mb_per_worker * s.workers}
            for s in observation.stages
        ],
    }  # fmt: skip


def test_the_fit_splits_a_waiting_stages_time_into_cpu_and_wait():
    rng = np.random.default_rng(0)
    twin = PipelineTwin(TRUE, seed=1)
    allocations = [[int(rng.integers(1, 40)), int(rng.integers(1, 4))] for _ in range(60)]
    samples = [protocol_sample(twin.step(a).observation, i) for i, a in enumerate(allocations)]
    stages = {s["name"]: s for s in fit_scenario(samples)["stages"]}
    assert stages["fetch"]["wait_us_per_sample"] == pytest.approx(20_000, rel=0.1)
    assert stages["fetch"]["us_per_sample"] == pytest.approx(400, rel=0.15)
    assert "wait_us_per_sample" not in stages["decode"]
    assert stages["decode"]["us_per_sample"] == pytest.approx(3_000, rel=0.1)
