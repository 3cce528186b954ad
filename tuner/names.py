"""The tuners the control plane may run, by name, and the file of the shipped InTune policy.

Apart from :mod:`tuner.control`, which imports torch, so that the web app can list and check
tuner names (its serializers, its schema) without that import: about 1.5 s of CPU at each web
process's start, for a library only a tuning step needs.
"""

from dataclasses import fields
from pathlib import Path

from tuner.intune_config import IntuneConfig

DEFAULT_POLICY = Path(__file__).parent / "policies" / "intune-default.pt"
TUNER_NAMES = ("intune", "prior", "hillclimb", "lp", "static", "random")
MAX_STAGES = 16


def check_tuner(name: str, stage_names: list[str], options: dict) -> None:
    """Raise ``ValueError`` where :func:`tuner.control.make_tuner` would refuse this tuner:
    an unknown name, a pipeline of no stage or more than 16, an option the tuner does not take.

    The web app checks a job with it (webapp/jobs/api/serializers.py) instead of making the
    tuner, which loaded torch and the shipped policy into a web process: 1.5 to 4.5 s of CPU on
    the first job it was sent. ``make_tuner`` runs it first, so the two refuse the same."""
    if name not in TUNER_NAMES:
        raise ValueError(f"unknown tuner '{name}'; choose one of {', '.join(TUNER_NAMES)}")
    if not 1 <= len(stage_names) <= MAX_STAGES:
        raise ValueError(f"a pipeline has 1 to {MAX_STAGES} stages; got {len(stage_names)}")
    if name == "intune":
        unknown = set(options) - {f.name for f in fields(IntuneConfig)} - {"policy"}
        if unknown:
            raise ValueError(
                f"unknown intune options {sorted(unknown)}; use IntuneConfig fields or 'policy'"
            )
    elif options:
        raise ValueError(f"tuner '{name}' takes no options; got {sorted(options)}")
