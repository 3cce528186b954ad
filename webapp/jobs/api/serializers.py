import re

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

import tuner as tuner_lib
from webapp.jobs.models import HOST_STATES, Allocation, AuditEntry, Host, Job, Stage
from webapp.strict_fields import (
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    StrictModelSerializer,
)

HOST_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
# A stage's name may also join fused stages with '+' ("read+parse": agents.pipeline.fusion).
STAGE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.+-]{0,63}$")
# The largest primary key the database holds (a 64-bit integer); a bigger id is a 400, not a 500.
MAX_ID = 2**63 - 1


def _holds_nul(value) -> bool:
    """Whether a JSON value holds a NUL character anywhere (PostgreSQL cannot store one)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    return False


class StageSerializer(StrictModelSerializer):
    max_workers = StrictIntegerField(
        min_value=1, max_value=100_000, required=False, allow_null=True
    )
    memory_mb_per_worker = StrictFloatField(
        min_value=0.0, max_value=1e7, required=False, allow_null=True
    )

    class Meta:
        model = Stage
        fields = ["name", "max_workers", "memory_mb_per_worker"]

    def validate_name(self, value: str) -> str:
        if not STAGE_NAME.match(value):
            raise serializers.ValidationError(
                "a stage name starts with a letter and has at most 64 letters, digits, '_', '.', "
                "'-' or '+' (which joins fused stages)"
            )
        return value


class JobSerializer(StrictModelSerializer):
    stages = StageSerializer(many=True)
    tuner = StrictCharField(default="intune")
    decision_interval_s = StrictFloatField(min_value=0.5, max_value=3600, default=5.0)
    tuning_options = serializers.DictField(required=False, default=dict)
    hosts_online = serializers.SerializerMethodField()
    hosts_total = serializers.SerializerMethodField()
    tuning = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
            "id", "name", "description", "stages", "tuner", "decision_interval_s", "tuning_options",
            "hosts_online", "hosts_total", "tuning", "created_at",
        ]  # fmt: skip
        read_only_fields = ["id", "created_at"]

    def validate_stages(self, stages: list[dict]) -> list[dict]:
        if not 1 <= len(stages) <= 16:
            raise serializers.ValidationError(
                "a pipeline has between 1 and 16 stages (what the tuner handles)"
            )
        names = [s["name"] for s in stages]
        if len(set(names)) != len(names):
            raise serializers.ValidationError(f"stage names must be unique, got {names}")
        if self.instance is not None and self.instance.hosts.exists():
            if names != self.instance.stage_names:
                raise serializers.ValidationError(
                    "the stages of a job with registered hosts cannot change; register a new job"
                )
        return stages

    def validate_tuner(self, value: str) -> str:
        if value not in tuner_lib.TUNER_NAMES:
            raise serializers.ValidationError(
                f"unknown tuner {value!r}; choose one of {sorted(tuner_lib.TUNER_NAMES)}"
            )
        return value

    def validate_tuning_options(self, value: dict) -> dict:
        if len(str(value)) > 4000:
            raise serializers.ValidationError("tuning options are limited to 4000 characters")
        if _holds_nul(value):
            raise serializers.ValidationError("tuning options must not contain NUL characters")
        return value

    def validate(self, attrs: dict) -> dict:
        """Refuse tuning options the chosen tuner does not take, now rather than when a session
        starts and fails."""
        from webapp.tuning.services import CONTROL_PLANE_OPTIONS

        job = self.instance
        tuner_name = attrs.get("tuner", job.tuner if job else "intune")
        options = attrs.get("tuning_options", job.tuning_options if job else {})
        stages = [s["name"] for s in attrs["stages"]] if "stages" in attrs else job.stage_names
        tuner_options = {k: v for k, v in options.items() if k not in CONTROL_PLANE_OPTIONS}
        try:
            tuner_lib.make_tuner(tuner_name, stages, **tuner_options)
        except (TypeError, ValueError) as exc:
            raise serializers.ValidationError({"tuning_options": str(exc)}) from exc
        return attrs

    def get_hosts_online(self, job: Job) -> int:
        return sum(1 for host in job.hosts.all() if host.is_online)

    def get_hosts_total(self, job: Job) -> int:
        return len(job.hosts.all())

    def get_tuning(self, job: Job) -> str:
        running = [s for s in job.sessions.all() if s.status in ("running", "pretraining")]
        return "running" if running else "stopped"


class AllocationSerializer(serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Allocation
        fields = [
            "version",
            "workers",
            "source",
            "status",
            "refusal_reason",
            "created_by",
            "created_at",
            "applied_at",
        ]


class ActiveOverrideSerializer(serializers.Serializer):
    """The override in force on a host: the host's API (``override``) and the dashboard's host
    panel both show it so."""

    workers = serializers.DictField(child=serializers.IntegerField(), read_only=True)
    reason = serializers.CharField(read_only=True)
    created_by = serializers.CharField(
        source="created_by.username", read_only=True, allow_null=True
    )
    created_at = serializers.DateTimeField(read_only=True)
    expires_at = serializers.DateTimeField(read_only=True, allow_null=True)


def active_override_data(host: Host) -> dict | None:
    """The host's override in force, rendered by :class:`ActiveOverrideSerializer`, or ``None``."""
    from webapp.tuning.services import active_override

    override = active_override(host)
    return None if override is None else ActiveOverrideSerializer(override).data


class HostSerializer(StrictModelSerializer):
    cpus = StrictFloatField(min_value=0.01, max_value=100_000)
    memory_mb = StrictFloatField(min_value=1, max_value=1e9)
    worker_budget = StrictIntegerField(
        min_value=1, max_value=100_000, required=False, allow_null=True
    )
    state = serializers.ChoiceField(choices=HOST_STATES, read_only=True)
    allocation = serializers.SerializerMethodField()
    override = serializers.SerializerMethodField()

    class Meta:
        model = Host
        fields = [
            "id", "job", "name", "cpus", "memory_mb", "worker_budget", "state", "last_seen",
            "allocation_version", "applied_version", "dropped_samples", "allocation", "override", "created_at",
        ]  # fmt: skip
        read_only_fields = [
            "id",
            "job",
            "last_seen",
            "allocation_version",
            "applied_version",
            "dropped_samples",
            "created_at",
        ]

    @extend_schema_field(AllocationSerializer(allow_null=True))
    def get_allocation(self, host: Host) -> dict | None:
        newest = host.allocations.order_by("-version").first()
        return AllocationSerializer(newest).data if newest else None

    @extend_schema_field(ActiveOverrideSerializer(allow_null=True))
    def get_override(self, host: Host) -> dict | None:
        return active_override_data(host)

    def validate_name(self, value: str) -> str:
        if not HOST_NAME.match(value):
            raise serializers.ValidationError(
                "a host name starts with a letter and has at most 64 letters, digits, '_', '.' or '-'"
            )
        return value


class HostRegisteredSerializer(HostSerializer):
    agent_token = serializers.CharField(
        read_only=True, help_text="Shown once; only its hash is stored."
    )

    class Meta(HostSerializer.Meta):
        fields = HostSerializer.Meta.fields + ["agent_token"]


class AuditEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEntry
        fields = ["id", "at", "actor_name", "action", "job", "host", "details"]
