"""Tuning sessions, the policy's decisions, and people's overrides."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from webapp.jobs.models import Allocation, Host, Job


class TuningSession(models.Model):
    """One tuner deciding the allocation of one host, step by step, as a chain of Celery tasks."""

    class Status(models.TextChoices):
        PRETRAINING = "pretraining"
        RUNNING = "running"
        STOPPED = "stopped"
        FAILED = "failed"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="sessions")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="sessions")
    tuner = models.CharField(max_length=32)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.RUNNING)
    decision_interval_s = models.FloatField(default=5.0)
    max_steps = models.PositiveIntegerField(null=True, blank=True)
    # Steps taken so far; the next task in the chain carries the step it expects, so a task
    # delivered twice (worker killed after scheduling its successor) finds nothing to do.
    steps = models.PositiveIntegerField(default=0)
    # The policy's weights, optimiser and replay state after the newest step.
    checkpoint = models.BinaryField(null=True, blank=True)
    # Samples up to this timestamp have been used by a decision.
    last_sample_ts = models.FloatField(default=0.0)
    last_step_at = models.DateTimeField(null=True, blank=True)
    # Touched by every task of the chain, even one that only waits for fresh metrics: a session
    # whose heartbeat stops (its worker died) is picked up again by the watchdog.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    started_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"session {self.pk} ({self.tuner}) on {self.host}"


class Decision(models.Model):
    """One step of a tuning session: what the policy saw, chose, and why."""

    session = models.ForeignKey(TuningSession, on_delete=models.CASCADE, related_name="decisions")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="decisions")
    step = models.PositiveIntegerField()
    observation = models.JSONField()
    action = models.CharField(max_length=200)
    q_values = models.JSONField(null=True, blank=True)
    reward = models.FloatField(null=True, blank=True)
    epsilon = models.FloatField(null=True, blank=True)
    info = models.JSONField(default=dict, blank=True)
    allocation = models.ForeignKey(
        Allocation, null=True, blank=True, on_delete=models.SET_NULL, related_name="decisions"
    )
    latency_ms = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["session", "step"], name="unique_decision_step"),
        ]


class OverrideQuerySet(models.QuerySet):
    def in_force(self) -> "Override | None":
        """The newest override neither ended nor expired (``host.overrides.in_force()``: the
        jobs API reads it through the relation, without importing this app)."""
        return (
            self.filter(ended_at__isnull=True)
            .exclude(expires_at__lte=timezone.now())
            .order_by("-created_at")
            .first()
        )


class Override(models.Model):
    """A person's allocation for a host; it pauses the policy there until expired or released."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="overrides")
    workers = models.JSONField()
    reason = models.TextField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    ended_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    end_reason = models.CharField(max_length=16, blank=True, default="")
    allocation = models.ForeignKey(
        Allocation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    objects = OverrideQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    @property
    def is_active(self) -> bool:
        if self.ended_at is not None:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()
