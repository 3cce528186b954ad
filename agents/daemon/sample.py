"""Turning the pipeline's and trainer's measurements into protocol-valid sample fields.

The control plane refuses a whole batch for one bad value (docs/agent-protocol.md), so a NaN
from a division by a zero interval, or a busy fraction of 1.02 from timer jitter, must not
cost an hour of buffered samples. Values are coerced here, once, at the source.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

STAGE_FLOATS = ("items_per_s", "busy_fraction", "cpu_percent", "runqueue_percent", "rss_mb")
STAGE_INTS = ("workers", "in_queue", "out_queue", "queue_capacity")
TRAINER_FLOATS = ("throughput", "idle_fraction", "step_ms", "wait_ms")


class NothingToSample(RuntimeError):
    """The pipeline has nothing to measure this interval (no rank of the host reported lately);
    the agent skips the sample quietly."""


def _number(value: object) -> float:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) else 0.0


def _fraction(value: object) -> float:
    return min(1.0, max(0.0, _number(value)))


def stage_fields(metrics: Mapping[str, object]) -> dict:
    """One stage's metrics with exactly the protocol's keys, finite and in range."""
    out: dict = {"name": str(metrics["name"])}
    for key in STAGE_INTS:
        out[key] = max(0, int(_number(metrics.get(key, 0))))
    for key in STAGE_FLOATS:
        out[key] = max(0.0, round(_number(metrics.get(key, 0.0)), 4))
    out["busy_fraction"] = _fraction(out["busy_fraction"])
    return out


def trainer_fields(stats: Mapping[str, object]) -> dict:
    """The trainer's stats with exactly the protocol's keys, finite and in range."""
    out: dict = {key: max(0.0, round(_number(stats.get(key, 0.0)), 4)) for key in TRAINER_FLOATS}
    out["idle_fraction"] = _fraction(out["idle_fraction"])
    out["device"] = str(stats.get("device", "cpu"))
    return out
