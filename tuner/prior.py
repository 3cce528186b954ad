"""``prior``: InTune with its learning taken out, the ablation that shows what the learning adds.

InTune's Q-value of an action is ``V + scale * gain(a) + residual(a) - change_cost``
(:mod:`tuner.qnetwork`): ``gain(a)`` is the model's predicted change of the bottleneck's log
capacity (:mod:`tuner.actions`), ``V`` and ``residual`` are what the network learnt. ``prior``
keeps the same features, action space, masks, estimators (memory, scaling, CPU per worker) and
change cost, and sets ``V`` and ``residual`` to zero: the network's last layers are zero and never
trained; nor does it use intune's online capacity fit (:mod:`tuner.capacity`), learning too. It
thus chooses the action with the largest ``scale * gain(a) - change_cost``, or holds;
exactly what the model-based part of intune decides, and nothing the network learnt, before or
online.
"""

from __future__ import annotations

import torch

from tuner.intune import IntuneConfig, IntuneTuner
from tuner.qnetwork import QNetwork


def zero_residual(network: QNetwork) -> None:
    """Make ``network``'s learnt part (the value and the bounded residuals) exactly zero."""
    with torch.no_grad():
        for head in (network.stage_head[-1], network.pipeline_head[-1]):
            head.weight.zero_()
            head.bias.zero_()


class PriorTuner(IntuneTuner):
    """InTune's model-based rebalancing alone: no Q-network contribution, no online learning."""

    name = "prior"

    def __init__(
        self, stage_names: list[str] | None = None, config: IntuneConfig | None = None, seed=0
    ) -> None:
        super().__init__(stage_names, config, seed=seed, mode="online")
        zero_residual(self.q_network)
        zero_residual(self.target_network)

    @property
    def uses_capacity_fit(self) -> bool:
        """Never: fitting the capacity curves online is learning."""
        return False

    @property
    def uses_measured_best(self) -> bool:
        """Never: remembering the throughput measured per allocation is learning."""
        return False

    def _maybe_learn(self) -> None:
        """Never learns: the network stays at zero residual."""

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        # A checkpoint of a prior tuner holds zero heads already; this keeps it so whatever
        # weights a checkpoint carries.
        zero_residual(self.q_network)
        zero_residual(self.target_network)
