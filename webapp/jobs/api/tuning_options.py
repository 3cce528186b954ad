"""A job's ``tuning_options``: the options a tuner takes, each with its JSON type and range.

One table says it, and both the validation and the OpenAPI schema read it, so a client (or a
fuzzer) that follows the schema sends options the control plane takes. The ranges keep out
values with which a tuning session would fail later (a Q-network 0 units wide, a batch of 0).
They belong with ``tuner.intune_config.IntuneConfig``; until it states them, they are here.

The ``policy`` option of ``tuner.make_tuner`` (a file path on the control plane) is not taken
through the API: a client must not make the server read a file of its choosing. Every session
starts from the shipped policy, so ``hidden`` (the width of its network) is not an option either.
"""

from typing import get_type_hints

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

import tuner as tuner_lib
from tuner.intune_config import IntuneConfig

MAX_PRETRAIN_STEPS = 100_000
# The shipped policy's weights fix the Q-network's shape: another width could not load them.
FIXED_BY_THE_POLICY = {"hidden"}
MAX_TUNING_OPTIONS_CHARS = 4000
# (lowest, highest, lowest excluded) for each IntuneConfig field; a field missing here (one
# added to IntuneConfig later) takes any number from 0 up.
_FRACTION = (0.0, 1.0, False)
_RATE = (0.0, 1.0, True)
_COUNT = (1, 10_000_000, False)
_INTUNE_RANGES = {
    "gamma": _FRACTION,
    "learning_rate": _RATE,
    "batch_size": (1, 65_536, False),
    "buffer_size": _COUNT,
    "learning_starts": (0, 10_000_000, False),
    "train_frequency": _COUNT,
    "target_network_frequency": _COUNT,
    "tau": _RATE,
    "start_e": _FRACTION,
    "end_e": _FRACTION,
    "exploration_steps": _COUNT,
    "max_grad_norm": (0.0, 1e6, True),
    "online_epsilon": _FRACTION,
    "online_buffer_size": (1, 100_000, False),
    "online_batch_size": (1, 4096, False),
    "online_learning_starts": (0, 1_000_000, False),
    "online_learning_rate": _RATE,
    "online_target_network_frequency": _COUNT,
    "oom_penalty": (0.0, 1e6, False),
    "memory_soft_limit": _FRACTION,
    "memory_penalty": (0.0, 1e6, False),
    "change_cost": (0.0, 1e6, False),
}


def _tuning_option_schemas() -> dict[str, dict]:
    """Each tuning option a job may set, with its JSON schema: the control plane's own
    (``pretrain_steps``) and intune's (``IntuneConfig``'s fields)."""
    options = {
        "pretrain_steps": {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_PRETRAIN_STEPS,
            "description": "decisions taken on the host's fitted twin before online tuning",
        },
        "layout": {
            "type": "string",
            "enum": ["off", "auto"],
            "description": "auto: each tuning step may also choose which neighbouring stages "
            "run fused (the allocation's layout, docs/agent-protocol.md); off (the default): "
            "the layout in force is left as it is",
        },
    }
    for name, kind in get_type_hints(IntuneConfig).items():
        if name in FIXED_BY_THE_POLICY:
            continue
        low, high, exclusive = _INTUNE_RANGES.get(name, (0, None, False))
        schema = {"type": "integer" if kind is int else "number", "minimum": low}
        if high is not None:
            schema["maximum"] = high
        if exclusive:
            schema["exclusiveMinimum"] = True
        options[name] = schema | {"description": f"intune only: IntuneConfig.{name}"}
    return options


TUNING_OPTIONS = _tuning_option_schemas()


def holds_nul(value) -> bool:
    """Whether a JSON value holds a NUL character anywhere (PostgreSQL cannot store one)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(holds_nul(k) or holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(holds_nul(v) for v in value)
    return False


def option_error(value, schema: dict) -> str | None:
    """What is wrong with one tuning option's value against its schema, or ``None``."""
    kind = schema["type"]
    if kind == "string":
        if value not in schema["enum"]:
            return f"must be one of {', '.join(schema['enum'])}, got {value!r}"[:200]
        return None
    numeric = int if kind == "integer" else int | float
    if isinstance(value, bool) or not isinstance(value, numeric):
        return f"must be a{'n' if kind == 'integer' else ''} {kind}, got {value!r}"[:200]
    low, high = schema["minimum"], schema.get("maximum")
    too_low = value <= low if schema.get("exclusiveMinimum") else value < low
    if too_low or (high is not None and value > high):
        above = "above" if schema.get("exclusiveMinimum") else "at least"
        upto = f" and at most {high:g}" if high is not None else ""
        return f"must be {above} {low:g}{upto}, got {value:g}"
    return None


@extend_schema_field(
    {
        "type": "object",
        "properties": TUNING_OPTIONS,
        "additionalProperties": False,
        "description": "The tuner's options. intune takes any of these; the baselines "
        f"({', '.join(n for n in tuner_lib.TUNER_NAMES if n != 'intune')}) only pretrain_steps "
        "and layout. "
        f"At most {MAX_TUNING_OPTIONS_CHARS} characters in all.",
    }
)
class TuningOptionsField(serializers.DictField):
    """A job's ``tuning_options``: only options a tuner takes, each of its type and range."""

    def to_internal_value(self, data) -> dict:
        options = super().to_internal_value(data)
        if len(str(options)) > MAX_TUNING_OPTIONS_CHARS:
            raise serializers.ValidationError(
                f"tuning options are limited to {MAX_TUNING_OPTIONS_CHARS} characters"
            )
        if holds_nul(options):
            raise serializers.ValidationError("tuning options must not contain NUL characters")
        errors = {}
        for name, value in options.items():
            if name not in TUNING_OPTIONS:
                errors[name] = f"no tuner takes this option; they are {sorted(TUNING_OPTIONS)}"
            elif (problem := option_error(value, TUNING_OPTIONS[name])) is not None:
                errors[name] = problem
        if errors:
            raise serializers.ValidationError(errors)
        return options


BASELINES = [name for name in tuner_lib.TUNER_NAMES if name != "intune"]


def job_rules_across_fields(result, generator, request, public):
    """drf-spectacular post-processing hook: what a property's own schema cannot say about a
    job. A job with a baseline tuner takes only ``pretrain_steps``; and stage names are unique
    (JSON Schema compares whole items: ``uniqueItems`` refuses repeated stages, the description
    says the rest)."""
    schemas = result.get("components", {}).get("schemas", {})
    baseline_options = {
        "type": "object",
        "properties": {name: TUNING_OPTIONS[name] for name in ("pretrain_steps", "layout")},
        "additionalProperties": False,
    }
    for name in ("JobRequest", "PatchedJobRequest"):
        if name not in schemas:
            continue
        stages = schemas[name]["properties"]["stages"]
        stages["uniqueItems"] = True
        stages["description"] = "the pipeline's stages in order, each name once"
        schemas[name]["anyOf"] = [
            {"properties": {"tuner": {"enum": ["intune"]}}},
            {
                "properties": {"tuner": {"enum": BASELINES}, "tuning_options": baseline_options},
                "required": ["tuner"],
            },
        ]
        if name == "PatchedJobRequest":
            # A PATCH without "tuner" keeps the job's, which the schema cannot know.
            schemas[name]["anyOf"].append({"not": {"required": ["tuner"]}})
    return result
