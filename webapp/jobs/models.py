"""Jobs, the stages of their pipelines, the hosts that run them, allocations and the audit log."""

import hashlib
import hmac
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

AGENT_TOKEN_PREFIX = "ia_"
# What a host is, as the API and the dashboard say it (``Host.state``).
HOST_STATES = ("new", "online", "offline")

# A job's tuning options that the control plane reads itself; the rest go to the tuner
# (IntuneConfig fields).
# "layout": "auto" lets the tuning step choose which stages run fused (webapp.tuning.layouts).
CONTROL_PLANE_OPTIONS = frozenset({"pretrain_steps", "layout"})


def hash_agent_token(token: str) -> str:
    """SHA-256 of an agent token: the only form in which a token is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


class Job(models.Model):
    """A training job whose hosts run the same data pipeline."""

    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True, default="")
    # Tuning settings: which tuner, seconds of fresh metrics between decisions, and options.
    tuner = models.CharField(max_length=32, default="intune")
    decision_interval_s = models.FloatField(default=5.0)
    tuning_options = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.name

    @property
    def stage_names(self) -> list[str]:
        return [stage.name for stage in self.stages.all()]


class Stage(models.Model):
    """One stage of a job's pipeline (read, parse, transform, ...), in pipeline order."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="stages")
    name = models.CharField(max_length=64)
    position = models.PositiveSmallIntegerField()
    max_workers = models.PositiveIntegerField(null=True, blank=True)
    memory_mb_per_worker = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["position"]
        constraints = [
            models.UniqueConstraint(fields=["job", "name"], name="unique_stage_name_per_job"),
            models.UniqueConstraint(
                fields=["job", "position"], name="unique_stage_position_per_job"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job.name}/{self.name}"


class Host(models.Model):
    """A trainer host running one agent, with its CPU and memory budgets."""

    class Status(models.TextChoices):
        NEW = "new"
        ONLINE = "online"
        OFFLINE = "offline"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="hosts")
    name = models.CharField(max_length=100)
    cpus = models.FloatField()
    memory_mb = models.FloatField()
    worker_budget = models.PositiveIntegerField()
    # Local ranks (training processes, ``torchrun --nproc-per-node``) whose pipelines share the
    # host: each runs the allocation, which is per rank (agents.budget).
    ranks = models.PositiveSmallIntegerField(default=1)
    token_hash = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.NEW)
    last_seen = models.DateTimeField(null=True, blank=True)
    last_seq = models.BigIntegerField(null=True, blank=True)
    # The newest allocation version published, and the newest the agent said it applied.
    allocation_version = models.PositiveIntegerField(default=0)
    applied_version = models.PositiveIntegerField(default=0)
    dropped_samples = models.PositiveBigIntegerField(default=0)
    # The host's pipeline twin (a version-1 scenario) fitted from its samples, when there is one.
    twin = models.JSONField(null=True, blank=True)
    twin_fitted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "name"], name="unique_host_name_per_job"),
        ]

    def __str__(self) -> str:
        return f"{self.job.name}/{self.name}"

    @staticmethod
    def new_token() -> str:
        return AGENT_TOKEN_PREFIX + secrets.token_urlsafe(32)

    def set_token(self, token: str) -> None:
        self.token_hash = hash_agent_token(token)

    def token_matches(self, token: str) -> bool:
        # Constant time, so the comparison leaks nothing about how much of a guess was right.
        return hmac.compare_digest(self.token_hash, hash_agent_token(token))

    @property
    def is_online(self) -> bool:
        if self.last_seen is None:
            return False
        silent_for = (timezone.now() - self.last_seen).total_seconds()
        return silent_for <= settings.INTUNE["AGENT_OFFLINE_AFTER_S"]

    @property
    def state(self) -> str:
        """One of ``HOST_STATES``: 'new' (never reported), 'online', or 'offline' (silent for
        longer than ``AGENT_OFFLINE_AFTER_S``). The API and the dashboard both show this."""
        if self.last_seen is None:
            return "new"
        return "online" if self.is_online else "offline"


class Allocation(models.Model):
    """Workers per stage for a host, versioned; the agent applies or refuses each version."""

    class Source(models.TextChoices):
        DEFAULT = "default"
        POLICY = "policy"
        OVERRIDE = "override"

    class Status(models.TextChoices):
        PENDING = "pending"
        APPLIED = "applied"
        REFUSED = "refused"
        SUPERSEDED = "superseded"

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="allocations")
    version = models.PositiveIntegerField()
    workers = models.JSONField()
    # Which neighbouring stages run fused (agents.layout); null: every stage alone, as before.
    layout = models.JSONField(null=True, blank=True)
    source = models.CharField(max_length=8, choices=Source.choices)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    refusal_reason = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    applied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host", "version"]
        constraints = [
            models.UniqueConstraint(fields=["host", "version"], name="unique_allocation_version"),
        ]

    def __str__(self) -> str:
        return f"{self.host} v{self.version} {self.workers}"


class AuditEntry(models.Model):
    """A change a person made: who, what, to which object, when, and the details."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=64)
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit"
    )
    host = models.ForeignKey(
        Host, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit"
    )
    details = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-at", "-id"]
