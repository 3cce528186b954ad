"""InTune's tuner: environment, pipeline twin, RL policy, baselines and bench.

Pure Python and torch (no Django). The control plane uses :mod:`tuner.control`, re-exported here.
Importing this package does not import torch: the names that need it (``make_tuner``, ``dumps``,
...) load :mod:`tuner.control` when first used, so a web process or a management command does
not pay torch's import at its start (about 1.5 s of CPU each, measured on the CI's 2 cores; the
test suite starts some 25 web servers). A Celery worker imports it as it starts
(webapp/celery.py): a tuning step must not pay it inside its transaction.
"""

from tuner.names import DEFAULT_POLICY, TUNER_NAMES, check_tuner
from tuner.observation import Decision, HostObservation, Observation, StageObservation

__all__ = [
    "DEFAULT_POLICY",
    "TUNER_NAMES",
    "Decision",
    "HostObservation",
    "Observation",
    "StageObservation",
    "Tuner",
    "check_tuner",
    "dumps",
    "finetune",
    "fit_scenario",
    "load_policy",
    "loads",
    "make_tuner",
]

_FROM_CONTROL = {"Tuner", "dumps", "finetune", "fit_scenario", "load_policy", "loads", "make_tuner"}


def __getattr__(name: str):
    """``tuner.make_tuner`` and the other names of :mod:`tuner.control`, imported on first use."""
    if name in _FROM_CONTROL:
        from tuner import control

        value = getattr(control, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
