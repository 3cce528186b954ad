"""The interface the control plane (``webapp/``) calls: observations in, decisions out.

``make_tuner`` builds a tuner by name; ``decide`` turns an :class:`Observation` into a
:class:`Decision` (and, for ``intune``, learns online from the transition that ended there);
``dumps``/``loads`` checkpoint a tuner to bytes and back so that decisions continue identically;
``fit_scenario`` builds a job's twin from what its agent reported; ``finetune`` trains an intune
tuner on such a twin before it tunes the real pipeline.
"""

from __future__ import annotations

import io
from dataclasses import fields
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from tuner.baselines import HillClimbTuner, LinearProgramTuner, RandomTuner, StaticTuner
from tuner.finetuning import finetune
from tuner.fit import fit_scenario
from tuner.intune import IntuneConfig, IntuneTuner
from tuner.names import DEFAULT_POLICY, TUNER_NAMES, check_tuner
from tuner.observation import Decision, HostObservation, Observation, StageObservation
from tuner.prior import PriorTuner

__all__ = [
    "DEFAULT_POLICY",
    "Decision",
    "HostObservation",
    "Observation",
    "StageObservation",
    "TUNER_NAMES",
    "Tuner",
    "dumps",
    "finetune",
    "fit_scenario",
    "load_policy",
    "loads",
    "make_tuner",
]

CHECKPOINT_FORMAT = "intune-tuner-checkpoint"
CHECKPOINT_VERSION = 1
_BASELINES = {
    "prior": PriorTuner,
    "hillclimb": HillClimbTuner,
    "lp": LinearProgramTuner,
    "static": StaticTuner,
    "random": RandomTuner,
}


@runtime_checkable
class Tuner(Protocol):
    """What every tuner offers the control plane."""

    name: str

    def decide(self, observation: Observation) -> Decision:
        """The next allocation; intune also learns from the transition ending here."""
        ...

    def state_dict(self) -> dict:
        """Everything needed to resume exactly."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        ...


def load_policy(path: str | Path = DEFAULT_POLICY) -> dict:
    """Read a policy file written by ``python -m tuner.pretrain``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"no InTune policy at {path}; run `python -m tuner.pretrain --out {path}` to make it"
        )
    return torch.load(path, weights_only=True)


def make_tuner(name: str, stage_names: list[str], seed: int = 0, **options) -> Tuner:
    """A tuner by name: ``intune``, ``prior``, ``hillclimb``, ``lp``, ``static`` or ``random``.

    ``intune`` loads the shipped pretrained policy unless ``policy`` names another file or is
    ``None`` (untrained weights); any :class:`~tuner.intune.IntuneConfig` field may be given as
    an option (e.g. ``online_epsilon=0.05``). ``prior`` is intune's model-based part alone
    (:mod:`tuner.prior`), with intune's default hyperparameters. Baselines take no options.
    """
    check_tuner(name, stage_names, options)
    if name == "intune":
        policy_path = options.pop("policy", DEFAULT_POLICY)
        policy = load_policy(policy_path) if policy_path is not None else None
        config_fields = {f.name for f in fields(IntuneConfig)}
        base = dict(policy["config"]) if policy else {}
        base.update(options)
        config = IntuneConfig(**{k: v for k, v in base.items() if k in config_fields})
        tuner = IntuneTuner(stage_names, config, seed=seed, mode="online")
        if policy:
            tuner.load_policy(policy)
        return tuner
    return _BASELINES[name](stage_names, seed=seed)


def dumps(tuner: Tuner) -> bytes:
    """A checkpoint of the tuner as bytes (for the database): name, stages and full state."""
    buffer = io.BytesIO()
    torch.save(
        {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "name": tuner.name,
            "stage_names": list(getattr(tuner, "stage_names", None) or []),
            "state": tuner.state_dict(),
        },
        buffer,
    )
    return buffer.getvalue()


def loads(data: bytes) -> Tuner:
    """The tuner a :func:`dumps` checkpoint holds; it decides exactly as the original would."""
    checkpoint = torch.load(io.BytesIO(data), weights_only=True)
    if checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError("these bytes are not a tuner checkpoint made by tuner.control.dumps")
    if checkpoint["version"] != CHECKPOINT_VERSION:
        raise ValueError(
            f"checkpoint version {checkpoint['version']} is not supported "
            f"(this code reads version {CHECKPOINT_VERSION})"
        )
    stage_names = checkpoint["stage_names"] or ["stage"]
    options = {"policy": None} if checkpoint["name"] == "intune" else {}
    tuner = make_tuner(checkpoint["name"], stage_names, **options)
    tuner.load_state_dict(checkpoint["state"])
    return tuner
