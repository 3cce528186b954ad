"""The OpenAPI schema of an agent's metrics batch: what webapp/ingestion/validation.py checks,
as JSON Schema, so that a client generated from /api/schema/ and a fuzzer reading it know the
protocol (docs/agent-protocol.md) as the server does.

The bounds are validation.py's. Two rules depend on stored data and are said in descriptions:
a sample lists each of the job's stages exactly once, by name; and ``samples`` may be empty
only when the batch carries an ``allocation_status``.
"""

from django.conf import settings
from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers

from webapp.ingestion.validation import MAX_CPU_PERCENT, MAX_MB, MAX_QUEUE, MAX_RATE, MAX_SEQ
from webapp.jobs.api.serializers import MAX_STAGES
from webapp.jobs.names import STAGE_NAME

MAX_VERSION = 2**31 - 1


def _number(low: float | None = 0.0, high: float | None = None, *, nullable: bool = False):
    schema: dict = {"type": "number"}
    if low is not None:
        schema["minimum"] = low
    if high is not None:
        schema["maximum"] = high
    if nullable:
        schema["nullable"] = True
    return schema


def _integer(low: int, high: int, *, nullable: bool = False) -> dict:
    schema = {"type": "integer", "minimum": low, "maximum": high}
    return schema | {"nullable": True} if nullable else schema


STAGE_SAMPLE = {
    "type": "object",
    "description": "one stage's measurements, averaged since the previous sample",
    "properties": {
        "name": {"type": "string", "pattern": STAGE_NAME, "description": "one of the job's stages"},
        "workers": _integer(1, 100_000),
        "items_per_s": _number(0.0, MAX_RATE),
        "busy_fraction": _number(0.0, 1.0),
        "in_queue": _number(0.0, MAX_QUEUE, nullable=True),
        "out_queue": _number(0.0, MAX_QUEUE, nullable=True),
        "queue_capacity": _number(0.0, MAX_QUEUE, nullable=True),
        "cpu_percent": _number(0.0, MAX_CPU_PERCENT, nullable=True),
        "runqueue_percent": _number(0.0, MAX_CPU_PERCENT, nullable=True)
        | {
            "description": "time the stage's workers were runnable but waiting for a CPU, "
            "summed over its workers (100 = one worker the whole time); 0 or absent: not "
            "measured"
        },
        "rss_mb": _number(0.0, MAX_MB, nullable=True),
    },
    "required": ["name", "workers", "items_per_s", "busy_fraction"],
}

SAMPLE = {
    "type": "object",
    "description": "one sample of the host, its stages and its trainer",
    "properties": {
        "seq": _integer(0, MAX_SEQ),
        "ts": _number(0.0, 1e11)
        | {
            "description": "Unix seconds; at most INTUNE_MAX_CLOCK_SKEW_S (300 s) ahead of the "
            "control plane's clock, else the batch is refused naming the sample"
        },
        "allocation_version": _integer(0, MAX_VERSION, nullable=True),
        "host": {
            "type": "object",
            "properties": {
                "cpus": _number(0.01, 1e5),
                "cpu_percent": _number(0.0, 100.0),
                "per_cpu_percent": {
                    "type": "array",
                    "items": _number(0.0, 100.0),
                    "maxItems": 4096,
                    "nullable": True,
                },
                "memory_used_mb": _number(0.0, 1e9),
                "memory_limit_mb": _number(1.0, 1e9),
                "worker_budget": _integer(1, 100_000, nullable=True),
                "ranks": {
                    **_integer(1, 1024, nullable=True),
                    "description": "the host's local ranks (training processes); 1 when absent",
                },
            },
            "required": ["cpus", "cpu_percent", "memory_used_mb", "memory_limit_mb"],
        },
        "trainer": {
            "type": "object",
            "properties": {
                "throughput": _number(0.0, 1e12),
                "idle_fraction": _number(0.0, 1.0),
                "step_ms": _number(0.0, 1e9, nullable=True),
                "wait_ms": _number(0.0, 1e9, nullable=True),
                "device": {"type": "string", "maxLength": 16, "default": "cpu"},
            },
            "required": ["throughput", "idle_fraction"],
        },
        "stages": {
            "type": "array",
            "items": STAGE_SAMPLE,
            "minItems": 1,
            "maxItems": MAX_STAGES,
            "description": "every stage of the job exactly once",
        },
        "ranks": {
            "type": "array",
            "maxItems": 1024,
            "description": "a multi-rank host's ranks, each once (at most host.ranks, each rank "
            "below it): the trainer and stages above are the host's totals",
            "items": {
                "type": "object",
                "properties": {
                    "rank": _integer(0, 1023),
                    "throughput": _number(0.0, 1e12),
                    "idle_fraction": _number(0.0, 1.0),
                    "step_ms": _number(0.0, 1e9, nullable=True),
                    "wait_ms": _number(0.0, 1e9, nullable=True),
                    "workers": {
                        "type": "object",
                        "nullable": True,
                        "additionalProperties": _integer(1, 100_000),
                        "description": "the workers per stage the rank's pipeline runs",
                    },
                },
                "required": ["rank", "throughput", "idle_fraction"],
            },
        },
    },
    "required": ["seq", "ts", "host", "trainer", "stages"],
}

ALLOCATION_STATUS = {
    "type": "object",
    "nullable": True,
    "description": "the allocation the agent applied, and versions it refused since its last batch",
    "properties": {
        "applied_version": _integer(0, MAX_VERSION, nullable=True),
        "refused": {
            "type": "array",
            "nullable": True,
            "maxItems": 100,
            "items": {
                "type": "object",
                "properties": {
                    "version": _integer(1, MAX_VERSION),
                    "reason": {"type": "string", "minLength": 1},
                },
                "required": ["version", "reason"],
            },
        },
    },
}


@extend_schema_field(SAMPLE)
class SampleField(serializers.JSONField):
    """One sample of a batch (the schema only: validation.py checks batches)."""


@extend_schema_field(ALLOCATION_STATUS)
class AllocationStatusField(serializers.JSONField):
    """A batch's allocation report (the schema only: validation.py checks batches)."""


def metrics_batch_serializer():
    """The request body of POST /api/v1/hosts/{host_id}/metrics/, for the schema."""
    return inline_serializer(
        "MetricsBatch",
        {
            "samples": serializers.ListField(
                child=SampleField(),
                max_length=settings.INTUNE["MAX_SAMPLES_PER_BATCH"],
                help_text="oldest first; empty only in a batch that reports an "
                "allocation_status (see docs/agent-protocol.md)",
            ),
            "allocation_status": AllocationStatusField(required=False, allow_null=True),
            "dropped_samples": serializers.IntegerField(
                required=False, min_value=0, max_value=2**40
            ),
        },
    )
