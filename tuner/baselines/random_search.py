"""Random search: each decision draws a fresh allocation uniformly over how many workers to use
(between one per stage and the host's CPU slots, one slot a worker: within the budget whatever the
stages were measured to use) and how to split them (a flat Dirichlet), within each stage's cap.
It knows nothing about memory, which is the point of a random baseline."""

from __future__ import annotations

import numpy as np

from tuner.observation import Decision, Observation


class RandomTuner:
    """Random allocations; reproducible from its seed."""

    name = "random"

    def __init__(self, stage_names: list[str] | None = None, seed: int = 0) -> None:
        self.stage_names = stage_names
        self.rng = np.random.default_rng(seed)

    def decide(self, observation: Observation) -> Decision:
        """A random allocation within the caps and the host's CPU slots."""
        stages = observation.stages
        n = len(stages)
        total = int(self.rng.integers(n, observation.host.worker_budget + 1))
        extra = self.rng.multinomial(total - n, self.rng.dirichlet(np.ones(n)))
        allocation = {}
        for stage, more in zip(stages, extra, strict=False):
            workers = 1 + int(more)
            allocation[stage.name] = min(workers, stage.max_workers or workers)
        return Decision(allocation, f"random draw of {sum(allocation.values())} workers")

    def state_dict(self) -> dict:
        """The generator's state, so a resumed tuner draws the same sequence."""
        state = self.rng.bit_generator.state
        return {
            "stage_names": self.stage_names,
            "rng": {
                k: (str(v) if not isinstance(v, dict) else {a: str(b) for a, b in v.items()})
                for k, v in state.items()
            },
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.stage_names = state["stage_names"]
        raw = state["rng"]
        restored = {}
        for key, value in raw.items():
            if isinstance(value, dict):
                restored[key] = {a: int(b) for a, b in value.items()}
            elif key == "bit_generator":
                restored[key] = value
            else:
                restored[key] = int(value)
        self.rng.bit_generator.state = restored
