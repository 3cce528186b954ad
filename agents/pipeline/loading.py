"""Find a pipeline by name (``dlrm``) or by ``module:factory``, and read allocation strings."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any

from agents.pipeline.errors import AllocationError
from agents.pipeline.pipeline import Pipeline

BUILTIN = {"dlrm": "agents.dlrm:build_pipeline"}


def load_factory(spec: str) -> Callable[..., Pipeline]:
    """Return the factory ``spec`` names: a built-in name or ``package.module:function``."""
    module_name, sep, attribute = BUILTIN.get(spec, spec).partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(
            f"pipeline {spec!r} is neither a built-in ({', '.join(BUILTIN)}) nor "
            f"'module:factory' (for example 'mypkg.pipelines:build')"
        )
    try:
        # A package may import its heavy dependencies when the factory is looked up.
        factory = getattr(importlib.import_module(module_name), attribute, None)
    except ImportError as exc:
        hint = (
            "install the dlrm extra: pip install 'intune[dlrm]'"
            if spec in BUILTIN
            else "is it on PYTHONPATH?"
        )
        raise ValueError(
            f"cannot import {module_name!r} for pipeline {spec!r} ({exc}); {hint}"
        ) from exc
    if not callable(factory):
        raise ValueError(f"{module_name!r} has no callable {attribute!r}")
    return factory


def build(spec: str, **options: Any) -> Pipeline:
    """Call the named factory and check that it returned a ``Pipeline``."""
    pipeline = load_factory(spec)(**options)
    if not isinstance(pipeline, Pipeline):
        raise TypeError(
            f"factory {spec!r} returned {type(pipeline).__name__}; it must return "
            f"agents.pipeline.Pipeline"
        )
    return pipeline


def parse_allocation(text: str) -> dict[str, int]:
    """Read ``"read=1,parse=3"`` into ``{"read": 1, "parse": 3}``."""
    allocation: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, count = part.partition("=")
        if not sep or not name.strip():
            raise AllocationError(f"{part!r} is not STAGE=N (for example parse=3)")
        try:
            allocation[name.strip()] = int(count)
        except ValueError:
            raise AllocationError(
                f"stage '{name.strip()}': {count!r} is not a whole number"
            ) from None
    return allocation


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """Read ``key=value`` factory options; values are JSON when they parse as JSON."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"option {pair!r} is not KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options
