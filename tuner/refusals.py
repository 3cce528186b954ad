"""Allocations the tuner asked for and the host did not apply: remembered, and not asked again.

The action mask counts CPU slots with the tuner's own estimate of each worker's CPU
(:func:`tuner.actions.measure_worker_cpu`). Where that estimate is wrong, the mask lets through
an allocation that the control plane's budget refuses, and the allocation in force stays what it
was. A stage whose workers wait longer as they are added (``wait_growth``) is such a case: its
threads measure less CPU each as the stage grows, while the budget counts them at the CPU of a
worker running unhindered. The model then predicts the same gain from the same refused request at
every decision, and the tuner sits still asking for it (``mw-11-consumer_change`` of
``tuner/suites/model_wrong.json``: 0.966 of the optimum for intune and ``prior`` alike).

What is learnt here is only what was seen: a request followed by an observation of another
allocation, on a host that was not out of memory. The CPU budget is monotone, so every allocation
with at least as many workers in every stage, in the same layout, is refused too and is masked.
A refusal is forgotten after :data:`MEMORY` decisions, or at once when the host's CPUs or CPU
slots change (a budget that grows may take it then). ``prior`` never remembers: it is learning.
"""

from __future__ import annotations

import numpy as np

from tuner.observation import Observation

MEMORY = 30
"""Decisions a refusal is remembered for: a budget that changed unseen is tried again."""


class Refusals:
    """The allocations the host refused, per layout, with the decision and host they were seen at."""

    def __init__(self) -> None:
        self.requested: tuple | None = None
        self.refused: dict[tuple, int] = {}
        self.host: tuple | None = None
        self.step = 0

    def update(self, observation: Observation, current: tuple) -> bool:
        """Fold in the observation after a request; ``current`` is its allocation key.
        Returns whether the last request was refused."""
        self.step += 1
        host = (observation.host.cpus, observation.host.worker_budget)
        if host != self.host:
            self.refused.clear()
            self.host = host
        self.refused = {k: s for k, s in self.refused.items() if self.step - s < MEMORY}
        requested, self.requested = self.requested, None
        # An out-of-memory step reports the allocation kept, too; the memory estimate handles it.
        if requested is None or observation.throughput <= 0 or requested == current:
            return False
        self.refused[requested] = self.step
        return True

    def request(self, key: tuple, current: tuple) -> None:
        """Record the allocation key asked for (nothing when it is the one in force)."""
        self.requested = key if key != current else None

    def mask(
        self, layout: tuple, allocations: dict[int, tuple[int, ...]], mask: np.ndarray
    ) -> None:
        """Clear ``mask`` for every action whose allocation has at least the workers of a refused
        one in every stage, in this layout."""
        refused = [np.asarray(k[1]) for k in self.refused if k[0] == layout]
        if not refused:
            return
        for index, allocation in allocations.items():
            # Holding (action 0) keeps the allocation in force, which the host runs.
            if (
                index != 0
                and mask[index]
                and any(np.all(np.asarray(allocation) >= r) for r in refused)
            ):
                mask[index] = False

    def state_dict(self) -> dict:
        """Everything to resume: as plain lists, so that any serialiser keeps it."""
        return {
            "requested": _to_lists(self.requested),
            "refused": [[_to_lists(k), s] for k, s in self.refused.items()],
            "host": list(self.host) if self.host is not None else None,
            "step": self.step,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a state made by :meth:`state_dict`."""
        self.requested = _to_key(state["requested"])
        self.refused = {_to_key(k): int(s) for k, s in state["refused"]}
        self.host = tuple(state["host"]) if state["host"] is not None else None
        self.step = int(state["step"])


def _to_lists(key: tuple | None):
    if key is None:
        return None
    layout, workers = key
    return [[list(group) for group in layout], list(workers)]


def _to_key(value) -> tuple | None:
    if value is None:
        return None
    layout, workers = value
    return (tuple(tuple(group) for group in layout), tuple(int(w) for w in workers))
