"""A pipeline twin: runs a scenario step by step and measures it the way an agent would.

Each :meth:`PipelineTwin.step` applies the allocation a tuner chose (or refuses it, as an agent
would, when it breaks a stage's bound or the host's CPU slots, :mod:`agents.budget`), runs the
model of ``tuner.model`` for that step, and returns a noisy
:class:`~tuner.observation.Observation` plus the noise-free truth that only the bench may look at.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tuner.model import (
    check_allocation,
    cpu_share,
    memory_mb,
    out_of_memory,
    stage_rates,
    stage_times,
    throughput,
)
from tuner.observation import HostObservation, Observation, StageObservation
from tuner.scenario import Scenario

# How sharply an output queue fills once the next stage is slower than this one: a logistic of
# the relative rate gap, so that queue fill tells an agent where the bottleneck sits.
QUEUE_SHARPNESS = 8.0


@dataclass(frozen=True)
class StepResult:
    """The outcome of one step: what the agent measured, and the truth for the bench."""

    observation: Observation
    throughput: float  # noise-free, 0 when out of memory
    out_of_memory: bool
    excused: bool  # out of memory only because an event shrank memory under the allocation held
    refused: str | None  # why the allocation was refused, as an agent would say it
    allocation_in_force: tuple[int, ...]


class PipelineTwin:
    """A simulated pipeline for one scenario; deterministic for a given seed."""

    def __init__(
        self,
        scenario: Scenario,
        seed: int = 0,
        initial_allocation: Sequence[int] | None = None,
    ) -> None:
        self.scenario = scenario
        self.rng = np.random.default_rng(seed)
        # CPU counters get their own noise stream, so the other measurements stay as they were
        # before the twin measured CPU per stage.
        self.cpu_rng = np.random.default_rng([seed, 1])
        self.step_index = 0
        start = initial_allocation or [1] * len(scenario.stages)
        self.in_force: tuple[int, ...] = tuple(int(w) for w in start)

    def reset(self) -> Observation:
        """Measure the initial allocation once (a warm-up window) and return what was seen."""
        host = self.scenario.host_at(0)
        return self._measure(self.in_force, host, oom=False)

    def allocation_vector(self, allocation: Mapping[str, int] | Sequence[int]) -> tuple[int, ...]:
        """An allocation as a tuple in pipeline order, from a dict keyed by stage name."""
        if isinstance(allocation, Mapping):
            missing = [s.name for s in self.scenario.stages if s.name not in allocation]
            if missing:
                raise ValueError(f"the allocation names no workers for stages {missing}")
            return tuple(int(allocation[s.name]) for s in self.scenario.stages)
        return tuple(int(w) for w in allocation)

    def step(self, allocation: Mapping[str, int] | Sequence[int]) -> StepResult:
        """Run one step with the chosen allocation and measure it."""
        chosen = self.allocation_vector(allocation)
        step = self.step_index
        self.step_index += 1
        host = self.scenario.host_at(step)
        refused = check_allocation(self.scenario, host, chosen)
        previous = self.in_force
        candidate = previous if refused else chosen
        oom = out_of_memory(self.scenario, host, candidate)
        memory_event = any(
            e.at_step == step and e.memory_gb is not None for e in self.scenario.events
        )
        excused = oom and memory_event and candidate == previous
        if not oom:
            self.in_force = candidate
        true_throughput = 0.0 if oom else throughput(self.scenario, host, candidate)
        observation = self._measure(candidate, host, oom=oom)
        return StepResult(observation, true_throughput, oom, excused, refused, self.in_force)

    def _noisy(self, value: float, rng: np.random.Generator | None = None) -> float:
        if self.scenario.noise <= 0:
            return value
        return value * (1.0 + (rng or self.rng).normal(0.0, self.scenario.noise))

    def _measure(self, allocation: tuple[int, ...], host, oom: bool) -> Observation:
        scenario = self.scenario
        rates = stage_rates(scenario, host, allocation)
        true_throughput = 0.0 if oom else throughput(scenario, host, allocation)
        consumer = host.consumer_samples_per_s
        share = cpu_share(scenario, host, allocation)
        us_now, wait_now = stage_times(scenario, allocation)
        stages = []
        pipeline_cores = 0.0
        for index, (stage, workers) in enumerate(zip(scenario.stages, allocation, strict=False)):
            busy = 0.0 if oom else min(1.0, true_throughput / rates[index])
            # A busy worker runs us / share of the wait + us / share it takes per sample, at
            # ``share`` of a CPU: what the agent's CPU counters see.
            us, wait = float(us_now[index]), float(wait_now[index])
            cores = workers * busy * share * us / (share * wait + us) if share > 0 else 0.0
            pipeline_cores += cores
            upstream = float(rates[: index + 1].min())
            downstream_rates = list(rates[index + 1 :]) + ([consumer] if consumer else [])
            downstream = min(downstream_rates) if downstream_rates else math.inf
            if oom:
                fill = 0.0
            elif math.isinf(downstream):
                fill = 0.0
            else:
                gap = (upstream - downstream) / max(upstream, downstream)
                fill = 1.0 / (1.0 + math.exp(-QUEUE_SHARPNESS * gap))
            memory_per_worker = stage.memory_mb_per_worker
            stages.append(
                StageObservation(
                    name=stage.name,
                    workers=self.in_force[index] if oom else workers,
                    items_per_s=max(0.0, self._noisy(true_throughput)),
                    busy_fraction=float(np.clip(self._noisy(busy), 0.0, 1.0)),
                    queue_fill=float(np.clip(self._noisy(fill), 0.0, 1.0)),
                    max_workers=stage.max_workers,
                    memory_mb_per_worker=max(0.0, self._noisy(memory_per_worker))
                    if memory_per_worker > 0
                    else 0.0,
                    cpu_percent=max(0.0, self._noisy(100.0 * cores, self.cpu_rng)),
                )
            )
        cpu_percent = 100.0 * min(1.0, (pipeline_cores + host.background_cpus) / host.cpus)
        if share < 1.0 and not oom:
            # The model's workers ask for more CPU than there is: the CPUs are saturated.
            cpu_percent = 100.0
        idle = 1.0 if consumer is None else max(0.0, 1.0 - true_throughput / consumer)
        return Observation(
            stages=stages,
            host=HostObservation(
                cpus=host.cpus,
                cpu_percent=float(np.clip(self._noisy(cpu_percent), 0.0, 100.0)),
                memory_limit_mb=host.memory_limit_mb,
                memory_used_mb=max(0.0, self._noisy(memory_mb(scenario, allocation))),
                worker_budget=host.worker_budget,
            ),
            throughput=max(0.0, self._noisy(true_throughput)),
            trainer_idle_fraction=float(np.clip(self._noisy(idle), 0.0, 1.0)),
        )
