"""The tuning environment with gymnasium's ``Env`` interface, for plugging in other RL libraries.

An observation is only what an agent can measure (never the twin's ground truth):

- ``stages``: ``[16, 5]`` per stage workers, items/s out, busy fraction, queue fill and CPU use
  (100 = one CPU; with the busy fraction it tells a stage that waits from one that computes),
  zero rows after the last stage, with ``stage_present`` marking real stages;
- ``host``: CPU count, CPU use (%), memory limit (MB), memory used (MB), CPU slots;
- ``pipeline``: throughput (samples/s) and the trainer's idle fraction.

Actions are InTune's (:mod:`tuner.actions`): ``Discrete(NUM_ACTIONS)``;
:meth:`TuningEnv.action_masks` (the convention of sb3-contrib's MaskablePPO) and
``info["action_mask"]`` tell which are allowed; a masked action is applied as ``hold``. The
reward is :func:`tuner.reward.tuning_reward`. Each episode is a scenario from the given list, or
a random twin from :mod:`tuner.generate`.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from agents.budget import WorkerCpuMeter
from tuner.actions import (
    MAX_STAGES,
    NUM_ACTIONS,
    EncodedState,
    encode,
    estimated_capacity,
    measure_worker_cpu,
)
from tuner.generate import random_scenario
from tuner.memory import MemoryEstimator
from tuner.observation import Observation
from tuner.reward import tuning_reward
from tuner.scaling import ScalingEstimator
from tuner.scenario import Scenario
from tuner.twin import PipelineTwin

STAGE_COLUMNS = 5


def observation_arrays(observation: Observation) -> dict[str, np.ndarray]:
    """An :class:`Observation` as the arrays of :attr:`TuningEnv.observation_space`."""
    stages = np.zeros((MAX_STAGES, STAGE_COLUMNS), np.float32)
    present = np.zeros(MAX_STAGES, np.int8)
    for i, stage in enumerate(observation.stages):
        stages[i] = (
            stage.workers,
            stage.items_per_s,
            stage.busy_fraction,
            stage.queue_fill,
            stage.cpu_percent or 0.0,
        )
        present[i] = 1
    host = observation.host
    return {
        "stages": stages,
        "stage_present": present,
        "host": np.array(
            [
                host.cpus,
                host.cpu_percent,
                host.memory_limit_mb,
                host.memory_used_mb,
                host.worker_budget,
            ],
            np.float32,
        ),  # fmt: skip
        "pipeline": np.array(
            [observation.throughput, observation.trainer_idle_fraction], np.float32
        ),
    }


class TuningEnv(gym.Env):
    """Split a host's CPUs across a pipeline's stages; see the module docstring."""

    metadata = {"render_modes": []}

    def __init__(self, scenarios: list[Scenario] | None = None, episode_steps: int = 150) -> None:
        self.scenarios = scenarios
        self.episode_steps = episode_steps
        inf = np.float32(np.inf)
        self.observation_space = spaces.Dict(
            {
                "stages": spaces.Box(0.0, inf, (MAX_STAGES, STAGE_COLUMNS), np.float32),
                "stage_present": spaces.MultiBinary(MAX_STAGES),
                "host": spaces.Box(0.0, inf, (5,), np.float32),
                "pipeline": spaces.Box(0.0, inf, (2,), np.float32),
            }
        )
        self.action_space = spaces.Discrete(NUM_ACTIONS)
        self._episode = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start an episode on the next scenario (or a random twin)."""
        super().reset(seed=seed)
        if self.scenarios:
            scenario = self.scenarios[self._episode % len(self.scenarios)]
        else:
            scenario = random_scenario(
                self.np_random, f"env-{self._episode}", steps=self.episode_steps
            )
        self._episode += 1
        self.twin = PipelineTwin(scenario, seed=int(self.np_random.integers(2**31)))
        self.memory = MemoryEstimator()
        self.per_worker: dict[str, float] = {}
        self.scaling = ScalingEstimator()
        self.worker_cpu = WorkerCpuMeter()
        self.steps = 0
        self.observation = self.twin.reset()
        self.last_good = self.observation.throughput
        self.state = self._encode(self.observation)
        return observation_arrays(self.observation), self._info(False)

    def _encode(self, observation: Observation) -> EncodedState:
        self.memory.update(observation)
        self.scaling.update(observation)
        exponents = {s.name: self.scaling.scaling(s.name) for s in observation.stages}
        if observation.throughput > 0:
            capacity = estimated_capacity(observation)
            self.per_worker = {
                s.name: float(c / s.workers ** exponents[s.name])
                for s, c in zip(observation.stages, capacity, strict=True)
            }
        worker_cpu = measure_worker_cpu(self.worker_cpu, observation)
        return encode(observation, self.memory, self.per_worker, exponents, worker_cpu)

    def action_masks(self) -> np.ndarray:
        """Which actions are allowed now."""
        return self.state.mask.copy()

    def _info(self, out_of_memory: bool, invalid: bool = False) -> dict:
        return {
            "action_mask": self.state.mask.copy(),
            "out_of_memory": out_of_memory,
            "invalid_action": invalid,
            "observation": self.observation,
        }

    def step(self, action: int):
        """Apply an action for one step of the twin."""
        action = int(action)
        invalid = not (0 <= action < NUM_ACTIONS and self.state.mask[action])
        if invalid:
            allocation = self.observation.allocation
        else:
            names = [s.name for s in self.observation.stages]
            allocation = dict(zip(names, self.state.allocations[action], strict=False))
        result = self.twin.step(allocation)
        self.observation = result.observation
        reward = tuning_reward(
            self.observation, self.last_good, changed=not invalid and action != 0
        )
        if self.observation.throughput > 0:
            self.last_good = self.observation.throughput
        self.state = self._encode(self.observation)
        self.steps += 1
        truncated = self.steps >= self.episode_steps
        info = self._info(result.out_of_memory, invalid)
        return observation_arrays(self.observation), reward, False, truncated, info
