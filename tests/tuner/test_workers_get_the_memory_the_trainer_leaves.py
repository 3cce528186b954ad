"""The tuner gives the pipeline's workers the memory the host has left besides them: on a host
whose trainer holds most of the memory (a DLRM's embedding tables in host memory), an
allocation whose workers would need more than what is left is never offered, and one that fits
is; on a twin, which holds nothing besides the workers, the whole limit, as before.

Generated: the host's limit, what the trainer holds, the workers' own memory per worker."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.actions import encode
from tuner.memory import MemoryEstimator
from tuner.observation import HostObservation, Observation, StageObservation


def _observation(limit: float, outside: float, per_worker: float) -> Observation:
    stages = [
        StageObservation("read", 1, 400.0, 0.9, 0.2, memory_mb_per_worker=per_worker),
        StageObservation("parse", 1, 400.0, 1.0, 0.1, memory_mb_per_worker=per_worker),
    ]
    held = 2 * per_worker
    host = HostObservation(
        cpus=16.0,
        cpu_percent=20.0,
        memory_limit_mb=limit,
        memory_used_mb=outside + held,
        worker_budget=18,
        memory_outside_mb=outside,
    )
    return Observation(stages, host, throughput=400.0, trainer_idle_fraction=0.5)


@settings(max_examples=60, deadline=None)
@given(
    limit=st.sampled_from([16_000.0, 64_000.0, 512_000.0]),
    outside_share=st.floats(0.0, 0.95),
    per_worker=st.floats(50.0, 4_000.0),
)
def test_no_allocation_offered_needs_more_than_the_memory_left(limit, outside_share, per_worker):
    outside = outside_share * limit
    memory = MemoryEstimator()
    observation = _observation(limit, outside, per_worker)
    memory.update(observation)
    state = encode(observation, memory)
    room = limit - outside
    upper = memory.per_worker_upper(["read", "parse"])
    needs = {
        a: float(sum(w * m for w, m in zip(a, upper, strict=True)))
        for a in state.allocations.values()
    }
    in_force = float(upper.sum())
    for allocation, need in needs.items():
        if allocation != (1, 1):
            assert need <= room or need < in_force, (allocation, need, room)
    # Growth that fits is offered: one more worker of either stage, when the room holds it.
    if 3 * float(upper.max()) <= room:
        assert any(sum(a) > 2 for a in state.allocations.values())


def test_the_trainers_memory_is_what_keeps_the_workers_back():
    """The same pipeline, workers of 2 GB each, on a 64 GB host: with nothing else on the host
    the tuner may grow it; with a trainer holding 58 GB it may not (before, it offered growth
    to 18 workers, 36 GB, where 6 GB was left)."""

    def most_workers(outside: float) -> int:
        memory = MemoryEstimator()
        observation = _observation(64_000.0, outside, 2_000.0)
        memory.update(observation)
        return max(sum(a) for a in encode(observation, memory).allocations.values())

    assert most_workers(0.0) > 2
    assert most_workers(58_000.0) == 2
