"""On a saturated host each stage's CPU per busy worker is read relative to the stages that
compute (agents.budget.relative_cpu_per_busy_worker). A stage busy a few percent of the time
reads above one CPU per busy worker (its workers' CPU outside the timed function); used as the
scale, it deflated every stage that computes into a waiting one, and the budget let the tuners
give a computing stage several times more workers than the host had CPUs.

Seen on the DLRM pipeline, 2 CPUs, loaded by other work (the readings below are that run's):
both intune and prior walked parse to 7-9 workers against a best of 2."""

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.budget import (
    WAITING_BELOW,
    WorkerCpuMeter,
    cpu_per_busy_worker,
    relative_cpu_per_busy_worker,
)

# python -m agents.pipeline run --pipeline dlrm --allocation read=2,parse=7,... under load.
DLRM_UNDER_LOAD = [
    {"name": "read", "workers": 2, "busy_fraction": 0.902, "cpu_percent": 14.9,
     "runqueue_percent": 170.1},
    {"name": "parse", "workers": 7, "busy_fraction": 0.987, "cpu_percent": 55.1,
     "runqueue_percent": 640.4},
    {"name": "transform", "workers": 1, "busy_fraction": 0.287, "cpu_percent": 5.0,
     "runqueue_percent": 41.1},
    {"name": "collate", "workers": 1, "busy_fraction": 0.163, "cpu_percent": 4.6,
     "runqueue_percent": 36.7},
    {"name": "prefetch", "workers": 1, "busy_fraction": 0.089, "cpu_percent": 2.3,
     "runqueue_percent": 21.1},
]  # fmt: skip


def test_the_dlrm_stages_that_compute_take_a_whole_slot_on_a_saturated_host():
    assert cpu_per_busy_worker(2.3, 1, 0.089, 21.1) > 2, "the reading that was the scale"
    relative = relative_cpu_per_busy_worker(DLRM_UNDER_LOAD, host_cpu_percent=100.0)
    assert relative["parse"] > 0.95 and relative["read"] > 0.95, relative
    meter = WorkerCpuMeter()
    for _ in range(3):
        meter.update(DLRM_UNDER_LOAD, 100.0)
    costs = meter.worker_cpu()
    assert costs["parse"] == 1.0 and costs["read"] == 1.0, costs


stage = st.fixed_dictionaries(
    {
        "workers": st.integers(1, 64),
        "busy_fraction": st.floats(0.0, 1.0),
        # 0 is "not measured"; readings are percents to two decimals at most.
        "cpu_percent": st.just(0.0) | st.floats(0.01, 6400.0),
        "runqueue_percent": st.just(0.0) | st.floats(0.01, 6400.0),
    }
)


@settings(max_examples=200, deadline=None)
@given(st.lists(stage, min_size=1, max_size=8), st.floats(0.0, 100.0))
def test_reading_a_saturated_host_relative_to_its_stages_only_ever_raises_a_reading(
    stages, host_cpu_percent
):
    stages = [dict(s, name=f"s{i}") for i, s in enumerate(stages)]
    alone = {s["name"]: relative_cpu_per_busy_worker([s], None) for s in stages}
    together = relative_cpu_per_busy_worker(stages, host_cpu_percent)
    assert set(together) == {name for name, one in alone.items() if one}
    for name, value in together.items():
        own = alone[name][name]
        assert 0.0 < value <= 1.0
        # Beside any other stages, saturated or not, a stage reads at least what it reads alone
        # (capped at one CPU): others can make it compute, never make it wait.
        assert value >= min(1.0, own) - 1e-12, (name, own, value)
        if own >= WAITING_BELOW:
            assert value >= WAITING_BELOW
