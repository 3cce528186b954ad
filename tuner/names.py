"""The tuners the control plane may run, by name, and the file of the shipped InTune policy.

Apart from :mod:`tuner.control`, which imports torch, so that the web app can list and check
tuner names (its serializers, its schema) without that import: about 1.5 s of CPU at each web
process's start, for a library only a tuning step needs.
"""

from pathlib import Path

DEFAULT_POLICY = Path(__file__).parent / "policies" / "intune-default.pt"
TUNER_NAMES = ("intune", "prior", "hillclimb", "lp", "static", "random")
