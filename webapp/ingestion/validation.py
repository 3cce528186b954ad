"""Validation of agents' metric batches (docs/agent-protocol.md).

Written by hand rather than with nested DRF serializers: a fleet sends thousands of stage
samples a second, and field-by-field serializer validation costs more than storing them.
Every error names the exact place in the batch and what was expected.
"""

import math
import time
from collections.abc import Mapping

from django.conf import settings

MAX_SEQ = 2**63 - 1
#: Most local ranks of one host (training processes on its accelerators).
MAX_RANKS = 1024
_INF = math.inf
# Bounds of a stage's figures, far above any real pipeline's and far below a double's range: a
# stage's 1.7e308 items/s was stored, and the sums over samples that the host's detail and its
# metrics read (budget, series) overflowed to infinity there: a 500, and a 400 on every read.
MAX_RATE = 1e12  # items/s, as trainer.throughput
MAX_QUEUE = 1e9  # items
MAX_CPU_PERCENT = 1e7  # 100 per CPU of a host of at most 100,000 CPUs (host.cpus)
MAX_MB = 1e9  # as host.memory_used_mb


# The server's clock, in Unix seconds (a test that compares two answers fixes it).
clock = time.time


def max_clock_skew_s() -> float:
    """How far ahead of the control plane's clock a sample's ``ts`` may be (settings)."""
    return settings.INTUNE["MAX_CLOCK_SKEW_S"]


def latest_sample_ts() -> float:
    """The latest ``ts`` a batch arriving now may carry: the server's clock plus the skew."""
    return clock() + max_clock_skew_s()


class BatchError(ValueError):
    """A batch the control plane refuses; the message says where and why."""

    status = 400


class BatchTooLarge(BatchError):
    """More samples than one batch may carry: ``413`` (docs/agent-protocol.md, "batch too
    large"), so that an agent sends smaller batches rather than dropping this one as it must
    drop a ``400``'s."""

    status = 413


def unpublished_version(status: dict | None, newest: int) -> str | None:
    """What is wrong with a validated ``allocation_status`` given the host's newest published
    version ``newest``, or None: a version applied or refused that was never published, or one
    reported both applied and refused."""
    if not status:
        return None
    applied = status["applied_version"]
    if applied is not None and applied > newest:
        return (
            f"allocation_status.applied_version {applied} was never published (newest is {newest})"
        )
    for i, refusal in enumerate(status["refused"]):
        if refusal["version"] > newest:
            return (
                f"allocation_status.refused[{i}].version {refusal['version']} was never "
                f"published (newest is {newest})"
            )
        if refusal["version"] == applied:
            return (
                f"allocation_status.refused[{i}].version {applied} is also the applied_version: "
                "a version is applied or refused, not both"
            )
    return None


def _number(
    value, where: str, key: str = "", *, low: float | None = 0.0, high: float | None = None
) -> float:
    """``value`` as a float, or BatchError naming ``where`` (``where.key`` when a key is
    given: the place is formatted only for the error, since a batch has hundreds of numbers)."""
    # The usual value first, in one test: a finite number within the bounds (NaN and the
    # infinities fail the chained comparison). Anything else takes the checks below, which say
    # what is wrong. Validation was a quarter of a batch's web CPU (cProfile: 365 calls of this
    # a batch of 5 samples x 8 stages), mostly these calls and the places formatted for them.
    if (
        (type(value) is float or type(value) is int)
        and -_INF < value < _INF
        and (low is None or value >= low)
        and (high is None or value <= high)
    ):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BatchError(f"{_place(where, key)}: must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise BatchError(f"{_place(where, key)}: must be finite, got {value}")
    if low is not None and value < low:
        raise BatchError(f"{_place(where, key)}: must be at least {low:g}, got {value:g}")
    if high is not None and value > high:
        raise BatchError(f"{_place(where, key)}: must be at most {high:g}, got {value:g}")
    return float(value)


def _integer(value, where: str, key: str = "", *, low: int = 0, high: int = MAX_SEQ) -> int:
    if type(value) is int and low <= value <= high:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise BatchError(f"{_place(where, key)}: must be an integer, got {value!r}"[:300])
    if not low <= value <= high:
        raise BatchError(f"{_place(where, key)}: must be between {low} and {high}, got {value}")
    return value


def _place(where: str, key: str) -> str:
    return f"{where}.{key}" if key else where


def _optional(section: Mapping, key: str, where: str, **bounds) -> float | None:
    value = section.get(key)
    return None if value is None else _number(value, where, key, **bounds)


def _object(value, where: str, key: str = "") -> Mapping:
    if type(value) is dict:
        return value
    if not isinstance(value, Mapping):
        raise BatchError(f"{_place(where, key)}: must be an object")
    return value


def validate_stage(raw, where: str, stage_names: set[str]) -> dict:
    raw = _object(raw, where)
    name = raw.get("name")
    if not isinstance(name, str) or name not in stage_names:
        raise BatchError(
            f"{where}.name: unknown stage {name!r}; this job's stages are {sorted(stage_names)}"
        )
    return {
        "stage": name,
        "workers": _integer(raw.get("workers"), where, "workers", low=1, high=100_000),
        "items_per_s": _number(raw.get("items_per_s"), where, "items_per_s", high=MAX_RATE),
        "busy_fraction": _number(raw.get("busy_fraction"), where, "busy_fraction", high=1.0),
        "in_queue": _optional(raw, "in_queue", where, high=MAX_QUEUE) or 0.0,
        "out_queue": _optional(raw, "out_queue", where, high=MAX_QUEUE) or 0.0,
        "queue_capacity": _optional(raw, "queue_capacity", where, high=MAX_QUEUE) or 0.0,
        "cpu_percent": _optional(raw, "cpu_percent", where, high=MAX_CPU_PERCENT) or 0.0,
        "runqueue_percent": _optional(raw, "runqueue_percent", where, high=MAX_CPU_PERCENT) or 0.0,
        "rss_mb": _optional(raw, "rss_mb", where, high=MAX_MB) or 0.0,
    }


def validate_rank(raw, where: str, ranks: int, stage_names: set[str]) -> dict:
    """One rank's trainer figures (and the workers its pipeline runs) in a multi-rank sample."""
    raw = _object(raw, where)
    workers = raw.get("workers")
    if workers is not None:
        workers = _object(workers, where, "workers")
        unknown = sorted(set(workers) - stage_names)
        if unknown:
            raise BatchError(
                f"{where}.workers: unknown stage(s) {unknown}; this job's stages are "
                f"{sorted(stage_names)}"
            )
        workers = {
            name: _integer(count, f"{where}.workers.{name}", low=1, high=100_000)
            for name, count in workers.items()
        }
    return {
        "rank": _integer(raw.get("rank"), where, "rank", high=ranks - 1),
        "throughput": _number(raw.get("throughput"), where, "throughput", high=1e12),
        "idle_fraction": _number(raw.get("idle_fraction"), where, "idle_fraction", high=1.0),
        "step_ms": _optional(raw, "step_ms", where, high=1e9),
        "wait_ms": _optional(raw, "wait_ms", where, high=1e9),
        "workers": workers,
    }


def validate_ranks(raw: Mapping, host: Mapping, where: str, stage_names: set[str]) -> tuple:
    """The host's local ranks (``host.ranks``, 1 when absent) and each rank's figures."""
    count = host.get("ranks")
    ranks = 1 if count is None else _integer(count, f"{where}.host.ranks", low=1, high=MAX_RANKS)
    listed = raw.get("ranks")
    if listed is None:
        return ranks, []
    if not isinstance(listed, list) or len(listed) > ranks:
        raise BatchError(
            f"{where}.ranks: must be a list of at most host.ranks ({ranks}) entries, one per rank"
        )
    rows = [
        validate_rank(r, f"{where}.ranks[{i}]", ranks, stage_names) for i, r in enumerate(listed)
    ]
    numbers = [r["rank"] for r in rows]
    if len(set(numbers)) != len(numbers):
        raise BatchError(f"{where}.ranks: a rank is listed twice ({numbers})")
    return ranks, rows


def future_ts(ts: float, where: str, latest_ts: float | None) -> None:
    """BatchError when a sample's ``ts`` is later than ``latest_ts`` (the server's clock plus
    the skew it allows, INTUNE_MAX_CLOCK_SKEW_S), naming the sample and how far ahead it is.

    Refused rather than clamped: a sample from the future would stay the host's newest (the
    tuner's windows, the dashboard, the offline alert read the newest) until the clock caught
    up, and one clamped to the server's time would no longer match itself when the agent
    resends its batch (a ``seq`` stored with another ``ts`` is a 409)."""
    if latest_ts is not None and ts > latest_ts:
        skew = max_clock_skew_s()
        raise BatchError(
            f"{where}.ts: {ts:.3f} is later than the control plane's clock allows (it is "
            f"{ts - latest_ts + skew:.0f} s ahead of it; at most {skew:g} s is taken): "
            "set the trainer host's clock (NTP) and send the sample with its corrected time"
        )


def validate_sample(raw, where: str, stage_names: set[str], latest_ts: float | None = None) -> dict:
    raw = _object(raw, where)
    host = _object(raw.get("host"), where, "host")
    trainer = _object(raw.get("trainer"), where, "trainer")
    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, list):
        raise BatchError(f"{where}.stages: must be a list with one entry per stage")
    stages = [
        validate_stage(s, f"{where}.stages[{i}]", stage_names) for i, s in enumerate(stages_raw)
    ]
    seen = [s["stage"] for s in stages]
    if len(set(seen)) != len(seen):
        raise BatchError(f"{where}.stages: a stage is listed twice ({seen})")
    if set(seen) != stage_names:
        missing = sorted(stage_names - set(seen))
        raise BatchError(f"{where}.stages: missing stage(s) {missing}; list every stage")
    per_cpu = host.get("per_cpu_percent")
    if per_cpu is not None:
        if not isinstance(per_cpu, list) or len(per_cpu) > 4096:
            raise BatchError(
                f"{where}.host.per_cpu_percent: must be a list of at most 4096 numbers"
            )
        per_cpu = [
            _number(v, f"{where}.host.per_cpu_percent[{i}]", high=100.0)
            for i, v in enumerate(per_cpu)
        ]
    device = trainer.get("device", "cpu")
    if not isinstance(device, str) or len(device) > 16:
        raise BatchError(f"{where}.trainer.device: must be a short string such as 'cpu' or 'cuda'")
    worker_budget = host.get("worker_budget")
    allocation_version = raw.get("allocation_version")
    ranks, rank_rows = validate_ranks(raw, host, where, stage_names)
    ts = _number(raw.get("ts"), where, "ts", low=0.0, high=1e11)
    future_ts(ts, where, latest_ts)
    return {
        "seq": _integer(raw.get("seq"), where, "seq"),
        "ts": ts,
        "allocation_version": None
        if allocation_version is None
        else _integer(allocation_version, where, "allocation_version", high=2**31 - 1),
        "cpus": _number(host.get("cpus"), f"{where}.host.cpus", low=0.01, high=1e5),
        "cpu_percent": _number(host.get("cpu_percent"), f"{where}.host.cpu_percent", high=100.0),
        "per_cpu_percent": per_cpu,
        "memory_used_mb": _number(
            host.get("memory_used_mb"), f"{where}.host.memory_used_mb", high=1e9
        ),
        "memory_limit_mb": _number(
            host.get("memory_limit_mb"), f"{where}.host.memory_limit_mb", low=1.0, high=1e9
        ),
        "worker_budget": None
        if worker_budget is None
        else _integer(worker_budget, f"{where}.host.worker_budget", low=1, high=100_000),
        "throughput": _number(trainer.get("throughput"), f"{where}.trainer.throughput", high=1e12),
        "idle_fraction": _number(
            trainer.get("idle_fraction"), f"{where}.trainer.idle_fraction", high=1.0
        ),
        "step_ms": _optional(trainer, "step_ms", f"{where}.trainer", high=1e9),
        "wait_ms": _optional(trainer, "wait_ms", f"{where}.trainer", high=1e9),
        "device": device,
        "stages": stages,
        "ranks": ranks,
        "rank_rows": rank_rows,
    }


def validate_batch(
    body, stage_names: set[str], max_samples: int, latest_ts: float | None = None
) -> dict:
    """Return the batch in storable form, or raise BatchError saying what is wrong.

    ``latest_ts``: the latest sample time taken (``latest_sample_ts()`` where a batch arrives;
    None takes any, as tests and benchmarks that store old batches want)."""
    body = _object(body, "body")
    samples = body.get("samples")
    if not isinstance(samples, list):
        raise BatchError("samples: must be a list")
    if not samples and body.get("allocation_status") is None:
        raise BatchError("samples: must not be empty unless the batch reports an allocation_status")
    if len(samples) > max_samples:
        raise BatchTooLarge(
            f"samples: at most {max_samples} samples per batch, got {len(samples)}; send smaller batches"
        )
    clean = [
        validate_sample(s, f"samples[{i}]", stage_names, latest_ts) for i, s in enumerate(samples)
    ]
    seqs = [s["seq"] for s in clean]
    if len(set(seqs)) != len(seqs):
        raise BatchError("samples: a sequence number appears twice in one batch")
    status = body.get("allocation_status")
    clean_status = None
    if status is not None:
        status = _object(status, "allocation_status")
        applied = status.get("applied_version")
        refused = status.get("refused")
        refused = [] if refused is None else refused  # not `or []`: {} is not a list
        if not isinstance(refused, list) or len(refused) > 100:
            raise BatchError("allocation_status.refused: must be a list of at most 100 refusals")
        clean_refused = []
        for i, item in enumerate(refused):
            item = _object(item, f"allocation_status.refused[{i}]")
            reason = item.get("reason")
            if not isinstance(reason, str) or not reason:
                raise BatchError(
                    f"allocation_status.refused[{i}].reason: must be a non-empty string"
                )
            clean_refused.append(
                {
                    "version": _integer(
                        item.get("version"),
                        f"allocation_status.refused[{i}].version",
                        low=1,
                        high=2**31 - 1,
                    ),
                    "reason": reason[:2000],
                }
            )
        clean_status = {
            "applied_version": None
            if applied is None
            else _integer(applied, "allocation_status.applied_version", high=2**31 - 1),
            "refused": clean_refused,
        }
    dropped = body.get("dropped_samples", 0)
    return {
        "samples": clean,
        "allocation_status": clean_status,
        "dropped_samples": _integer(dropped, "dropped_samples", high=2**40),
    }
