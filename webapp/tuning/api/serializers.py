from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

import tuner as tuner_lib
from webapp.jobs.api.serializers import MAX_ID, MAX_STAGES
from webapp.jobs.names import NOT_BLANK_TEXT
from webapp.strict_fields import (
    FullMatch,
    KnownFieldsOnly,
    StrictCharField,
    StrictDateTimeField,
    StrictIntegerField,
    StrictModelSerializer,
)
from webapp.tuning.models import Decision, Override, TuningSession


class TuningSessionSerializer(serializers.ModelSerializer):
    host_name = serializers.CharField(source="host.name", read_only=True)
    progress = serializers.SerializerMethodField()

    class Meta:
        model = TuningSession
        fields = [
            "id", "job", "host", "host_name", "tuner", "status", "decision_interval_s", "steps", "max_steps",
            "progress", "started_at", "stopped_at", "last_step_at", "error",
        ]  # fmt: skip

    def get_progress(self, session: TuningSession) -> dict:
        latest = session.decisions.order_by("-step").first()
        return {
            "steps": session.steps,
            "fraction": (session.steps / session.max_steps) if session.max_steps else None,
            "last_reward": latest.reward if latest else None,
            "epsilon": latest.epsilon if latest else None,
            "last_action": latest.action if latest else None,
        }


class TuningStartSerializer(KnownFieldsOnly, serializers.Serializer):
    tuner = serializers.ChoiceField(
        choices=tuner_lib.TUNER_NAMES,
        required=False,
        error_messages={
            "invalid_choice": f"unknown tuner {{input!r}}; choose one of {sorted(tuner_lib.TUNER_NAMES)}"
        },
    )
    max_steps = StrictIntegerField(required=False, min_value=1, max_value=1_000_000)
    hosts = serializers.ListField(
        child=StrictIntegerField(min_value=1, max_value=MAX_ID), required=False, max_length=10_000
    )


class DecisionSerializer(serializers.ModelSerializer):
    workers = serializers.JSONField(source="allocation.workers", read_only=True, allow_null=True)
    version = serializers.IntegerField(source="allocation.version", read_only=True, allow_null=True)

    class Meta:
        model = Decision
        fields = [
            "id", "session", "step", "created_at", "action", "q_values", "reward", "epsilon", "info",
            "observation", "workers", "version", "latency_ms",
        ]  # fmt: skip


# webapp.jobs.services.validate_allocation checks the counts (with messages that name the stage
# and the limit); the schema says the same of each count.
@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": {"type": "integer", "minimum": 1, "maximum": 100_000},
        "minProperties": 1,
        "maxProperties": MAX_STAGES,
        "description": "workers for every stage of the job, by stage name, within the host's "
        "budget",
    }
)
class WorkersField(serializers.DictField):
    """An allocation: stage name -> worker count."""

    child = serializers.JSONField()


class OverrideSerializer(StrictModelSerializer):
    workers = WorkersField()
    # Which stages run fused (agents.layout); webapp.jobs.services.validate_allocation checks it.
    layout = serializers.JSONField(
        required=False,
        allow_null=True,
        write_only=True,
        help_text='groups of neighbouring stages to run fused, e.g. [["read", "parse"], '
        '["transform", "collate"]]; workers then names each group "read+parse"',
    )
    reason = StrictCharField(
        max_length=2000,
        validators=[FullMatch(NOT_BLANK_TEXT, "say why you override the policy")],
    )
    expires_at = StrictDateTimeField(required=False, allow_null=True)
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    version = serializers.IntegerField(source="allocation.version", read_only=True)

    class Meta:
        model = Override
        fields = [
            "id",
            "workers",
            "layout",
            "reason",
            "expires_at",
            "created_by",
            "created_at",
            "ended_at",
            "end_reason",
            "version",
        ]
        read_only_fields = ["id", "created_by", "created_at", "ended_at", "end_reason", "version"]
