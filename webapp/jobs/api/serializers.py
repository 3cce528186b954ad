from django.core.validators import MaxLengthValidator, MinLengthValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.validators import UniqueValidator

import tuner as tuner_lib
from webapp.jobs.api.tuning_options import TuningOptionsField
from webapp.jobs.models import (
    CONTROL_PLANE_OPTIONS,
    HOST_STATES,
    Allocation,
    AuditEntry,
    Host,
    Job,
    Stage,
)
from webapp.jobs.names import HOST_NAME, NON_EMPTY_TEXT, NOT_BLANK_TEXT, STAGE_NAME
from webapp.jobs.services import budget_summary
from webapp.strict_fields import (
    FullMatch,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    StrictModelSerializer,
)

# The largest primary key the database holds (a 64-bit integer); a bigger id is a 400, not a 500.
MAX_ID = 2**63 - 1
MAX_STAGES = 16  # what the tuner handles
MAX_TEXT = 10_000
STAGES_MESSAGE = f"a pipeline has between 1 and {MAX_STAGES} stages (what the tuner handles)"


# drf-spectacular writes a blank-allowed field with a pattern as oneOf [pattern, empty string]:
# the pattern must not match the empty string too, or "" would match both (oneOf fails).
@extend_schema_field({"type": "string", "pattern": NON_EMPTY_TEXT, "maxLength": MAX_TEXT})
class TextWithoutNul(StrictCharField):
    """Text, blank allowed, without NUL (DRF's CharField refuses NUL; the schema says so too),
    of at most MAX_TEXT characters (a job's description took a whole 1 MiB body, and every
    answer listing jobs carried it)."""

    def __init__(self, **kwargs):
        super().__init__(max_length=MAX_TEXT, **kwargs)


class StageSerializer(StrictModelSerializer):
    name = StrictCharField(
        max_length=64,
        trim_whitespace=False,  # " read" is not "read": the schema's pattern refuses both
        validators=[
            FullMatch(
                STAGE_NAME,
                "a stage name starts with a letter and has at most 64 letters, digits, '_', '.', "
                "'-' or '+' (which joins fused stages)",
            )
        ],
    )
    max_workers = StrictIntegerField(
        min_value=1, max_value=100_000, required=False, allow_null=True
    )
    memory_mb_per_worker = StrictFloatField(
        min_value=0.0, max_value=1e7, required=False, allow_null=True
    )

    class Meta:
        model = Stage
        fields = ["name", "max_workers", "memory_mb_per_worker"]

    def validate(self, attrs: dict) -> dict:
        # A PATCH is partial, and DRF lets a partial update leave out any field, nested ones too;
        # but stages sent in a PATCH replace them all, so each still needs its name.
        if "name" not in attrs:
            raise serializers.ValidationError(
                {"name": "every stage needs a name (stages sent in a PATCH replace them all)"}
            )
        return attrs


class JobSerializer(StrictModelSerializer):
    name = StrictCharField(
        max_length=100,
        validators=[
            FullMatch(NOT_BLANK_TEXT, "a job name is text of at most 100 characters, not blank"),
            UniqueValidator(Job.objects.all(), message="a job with this name already exists"),
        ],
    )
    description = TextWithoutNul(required=False, allow_blank=True)
    # Validators rather than min_length/max_length: drf-spectacular writes them into the schema.
    stages = serializers.ListSerializer(
        child=StageSerializer(),
        validators=[
            MinLengthValidator(1, STAGES_MESSAGE),
            MaxLengthValidator(MAX_STAGES, STAGES_MESSAGE),
        ],
    )
    tuner = serializers.ChoiceField(
        choices=tuner_lib.TUNER_NAMES,
        default="intune",
        error_messages={
            "invalid_choice": f"unknown tuner {{input!r}}; choose one of {sorted(tuner_lib.TUNER_NAMES)}"
        },
    )
    decision_interval_s = StrictFloatField(min_value=0.5, max_value=3600, default=5.0)
    tuning_options = TuningOptionsField(required=False, default=dict)
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
        names = [s["name"] for s in stages]
        if len(set(names)) != len(names):
            raise serializers.ValidationError(f"stage names must be unique, got {names}")
        if self.instance is not None and self.instance.hosts.exists():
            if names != self.instance.stage_names:
                raise serializers.ValidationError(
                    "the stages of a job with registered hosts cannot change; register a new job"
                )
        return stages

    def validate(self, attrs: dict) -> dict:
        """Refuse tuning options the chosen tuner does not take, now rather than when a session
        starts and fails."""
        job = self.instance
        tuner_name = attrs.get("tuner", job.tuner if job else "intune")
        options = attrs.get("tuning_options", job.tuning_options if job else {})
        stages = [s["name"] for s in attrs["stages"]] if "stages" in attrs else job.stage_names
        tuner_options = {k: v for k, v in options.items() if k not in CONTROL_PLANE_OPTIONS}
        try:
            tuner_lib.check_tuner(tuner_name, stages, tuner_options)
        except ValueError as exc:  # what make_tuner refuses, a session would fail on later
            raise serializers.ValidationError(
                {"tuning_options": f"the {tuner_name} tuner cannot be made with these: {exc}"}
            ) from exc
        return attrs

    def get_hosts_online(self, job: Job) -> int:
        return sum(1 for host in job.hosts.all() if host.is_online)

    def get_hosts_total(self, job: Job) -> int:
        return len(job.hosts.all())

    def get_tuning(self, job: Job) -> str:
        running = [s for s in job.sessions.all() if s.status in ("running", "pretraining")]
        return "running" if running else "stopped"


class AllocationSerializer(serializers.ModelSerializer):
    # null for the default allocation and the policy's: no person made them.
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = Allocation
        fields = [
            "version",
            "workers",
            "layout",
            "source",
            "status",
            "refusal_reason",
            "created_by",
            "created_at",
            "applied_at",
        ]

    def to_representation(self, instance: Allocation) -> dict:
        """The allocation; ``layout`` only where it has one, so that an allocation without
        one reads exactly as before (docs/agent-protocol.md)."""
        data = super().to_representation(instance)
        if data.get("layout") is None:
            data.pop("layout", None)
        return data


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
    override = host.overrides.in_force()  # tuning's relation: jobs does not import tuning
    return None if override is None else ActiveOverrideSerializer(override).data


MAX_CPUS = 100_000
MAX_RANKS = 1024
# The most a host's default budget can be (agents.budget.cpu_slots: its whole CPUs plus one slot
# per stage of each rank), so that what the control plane fills in is one the schema allows.
MAX_WORKER_BUDGET = MAX_CPUS + MAX_STAGES * MAX_RANKS


class HostSerializer(StrictModelSerializer):
    name = StrictCharField(
        max_length=64,
        trim_whitespace=False,  # " host-1" is not "host-1": the schema's pattern refuses both
        validators=[
            FullMatch(
                HOST_NAME,
                "a host name starts with a letter and has at most 64 letters, digits, '_', '.' "
                "or '-'",
            )
        ],
    )
    cpus = StrictFloatField(min_value=0.01, max_value=MAX_CPUS)
    memory_mb = StrictFloatField(min_value=1, max_value=1e9)
    worker_budget = StrictIntegerField(
        min_value=1, max_value=MAX_WORKER_BUDGET, required=False, allow_null=True
    )
    ranks = StrictIntegerField(
        min_value=1,
        max_value=MAX_RANKS,
        required=False,
        help_text="Local ranks (training processes, torchrun --nproc-per-node) sharing the "
        "host; each runs the allocation, which is per rank. Default 1.",
    )
    state = serializers.ChoiceField(choices=HOST_STATES, read_only=True)
    allocation = serializers.SerializerMethodField()
    override = serializers.SerializerMethodField()
    budget = serializers.SerializerMethodField()

    class Meta:
        model = Host
        fields = [
            "id", "job", "name", "cpus", "memory_mb", "worker_budget", "ranks", "budget", "state", "last_seen",
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

    @extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True})
    def get_budget(self, host: Host) -> dict | None:
        """The budget in its terms (agents.budget): CPU slots, CPU used, memory, per stage."""
        return budget_summary(host)


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
