"""tf.data AUTOTUNE's hill climbing, as ``Model::OptimizeHillClimb`` in TensorFlow's
``tensorflow/core/framework/model.cc``.

Every optimisation pass starts every parallelism at its minimum (1) and repeatedly raises by one
the parameter whose increment most reduces the modelled output time, until the output time falls
below ``processing_time / cpu_budget``, every parameter is at its maximum, or the modelled memory
exceeds the RAM budget (half the memory, as tf.data's default). As in tf.data, the stopping test is
made before each increment, so the last increment may overshoot the RAM budget by one worker.

The model is tf.data's for a chain of asynchronous parallel nodes fed by an unknown (assumed
infinitely fast) consumer: each node's output time is its input's output time plus its own
per-element processing time divided by its parallelism, so the pipeline's output time is
``sum_i t_i / p_i``; ``processing_time`` is ``sum_i t_i``. ``t_i`` is measured each step (worker
time per element); the CPU budget is the host's CPU count. One adaptation: a parameter is not
raised past the host's CPU slots, one a worker (tf.data knows no worker that waits), since an
agent refuses an allocation over them.
"""

from __future__ import annotations

from tuner.baselines.measurements import MeasuredTuner
from tuner.observation import Decision, Observation


def output_time(times: list[float], parallelism: list[int]) -> float:
    """tf.data's modelled output time of the chain: ``sum(t_i / p_i)``."""
    return sum(t / p for t, p in zip(times, parallelism, strict=False))


def hill_climb(
    times: list[float],
    maximums: list[int],
    cpu_budget: float,
    memory_per_worker: list[float],
    ram_budget: float,
    worker_budget: int,
) -> list[int]:
    """One optimisation pass of tf.data's hill climbing; returns the parallelism per stage."""
    parallelism = [1] * len(times)
    processing_time = sum(times)
    while True:
        current = output_time(times, parallelism)
        all_max = all(p >= m for p, m in zip(parallelism, maximums, strict=False))
        buffered = sum(p * m for p, m in zip(parallelism, memory_per_worker, strict=False))
        if all_max or current < processing_time / cpu_budget or buffered > ram_budget:
            break
        if sum(parallelism) >= worker_budget:
            break
        best_delta, best = -1.0, None
        for i, (p, m) in enumerate(zip(parallelism, maximums, strict=False)):
            if p >= m:
                continue
            parallelism[i] += 1
            delta = current - output_time(times, parallelism)
            parallelism[i] -= 1
            if delta > best_delta:
                best_delta, best = delta, i
        if best is None:
            break
        parallelism[best] += 1
    return parallelism


class HillClimbTuner(MeasuredTuner):
    """tf.data AUTOTUNE's hill climbing; see the module docstring for the source."""

    name = "hillclimb"

    def allocate(self, observation: Observation) -> Decision:
        """Run one hill-climbing pass on the latest measurements."""
        stages = observation.stages
        host = observation.host
        room = host.worker_budget - (len(stages) - 1)
        allocation = hill_climb(
            times=[self.times.seconds_per_element[s.name] for s in stages],
            maximums=[min(s.max_workers or room, room) for s in stages],
            cpu_budget=max(host.cpus, 1.0),
            memory_per_worker=[self.times.memory_mb_per_worker.get(s.name, 0.0) for s in stages],
            ram_budget=0.5 * host.memory_limit_mb,
            worker_budget=host.worker_budget,
        )
        chosen = {s.name: w for s, w in zip(stages, allocation, strict=False)}
        return Decision(chosen, f"hill climb to {sum(allocation)} workers")
