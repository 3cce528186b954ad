"""Run by every Python process that ``intune-run`` starts (its directory leads ``PYTHONPATH``):
patch torch's DataLoader once torch is imported (``agents.autorun``), then run the
environment's own ``sitecustomize``, if it has one. Never fails the interpreter's start."""

import os
import sys


def _intune_autorun() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    # Leave the path as the program would have had it; children still get PYTHONPATH.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    if os.environ.get("INTUNE_AUTO") == "1":
        try:
            from agents import autorun

            autorun.install()
        except Exception as exc:  # noqa: BLE001 - not installed here, or broken: run untuned
            print(
                f"intune-run: DataLoaders not tuned in pid {os.getpid()}: {exc!r}", file=sys.stderr
            )
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is not None and spec.origin and os.path.dirname(os.path.abspath(spec.origin)) != here:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_intune_autorun()
del _intune_autorun
