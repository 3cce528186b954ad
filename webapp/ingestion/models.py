"""Metric samples that agents stream: one per host per interval, with one row per stage."""

from django.db import models

from webapp.jobs.models import Host


class HostSample(models.Model):
    """A host's measurements at one instant (or, rolled up, averaged over ``resolution_s``)."""

    # No index of its own: hostsample_host_ts and unique_sample_seq_per_host both begin with it
    # (an index fewer to maintain for every sample a fleet stores).
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="samples", db_index=False)
    # The agent's sequence number: unique per host so that a resent sample is stored once.
    # Rolled-up samples take the sequence number of the first raw sample they replace.
    seq = models.BigIntegerField()
    ts = models.FloatField(help_text="Unix seconds")
    resolution_s = models.PositiveIntegerField(default=1)
    allocation_version = models.PositiveIntegerField(null=True, blank=True)
    cpus = models.FloatField()
    cpu_percent = models.FloatField()
    memory_used_mb = models.FloatField()
    memory_limit_mb = models.FloatField()
    worker_budget = models.PositiveIntegerField(null=True, blank=True)
    # The host's local ranks: ``throughput`` and the stages are summed over them, and each
    # rank's own figures are a RankSample.
    ranks = models.PositiveSmallIntegerField(default=1)
    throughput = models.FloatField()
    idle_fraction = models.FloatField()
    step_ms = models.FloatField(null=True, blank=True)
    wait_ms = models.FloatField(null=True, blank=True)
    device = models.CharField(max_length=16, default="cpu")
    per_cpu_percent = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["host", "seq"], name="unique_sample_seq_per_host"),
        ]
        indexes = [models.Index(fields=["host", "ts"], name="hostsample_host_ts")]


class StageSample(models.Model):
    """One stage's measurements within a host sample.

    ``host`` and ``ts`` repeat the sample's so that a chart's query over a day of a host's
    stages reads one index range instead of joining every sample.
    """

    # Neither has an index of its own: stagesample_sample_stage and stagesample_host_ts begin
    # with them. ``host`` has no constraint in the database either: it is the sample's host,
    # written with the sample by every writer (inserts.BatchInsertPostgres, the generic path,
    # rollup.py), and the sample's own constraint (to its host) already holds the host in
    # place, so a stage row's host exists while its sample does. Checked for each of a batch's
    # 40 stage rows at its commit, that constraint cost PostgreSQL a fifth of its CPU for the
    # batch (docs/benchmarks.md, "Group commit and lighter stage rows"). Deleting a host still
    # deletes its stage rows (Django's CASCADE, and through their samples).
    sample = models.ForeignKey(
        HostSample, on_delete=models.CASCADE, related_name="stages", db_index=False
    )
    host = models.ForeignKey(
        Host, on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False
    )
    ts = models.FloatField()
    stage = models.CharField(max_length=64)
    workers = models.PositiveIntegerField()
    items_per_s = models.FloatField()
    busy_fraction = models.FloatField()
    in_queue = models.FloatField(default=0)
    out_queue = models.FloatField(default=0)
    queue_capacity = models.FloatField(default=0)
    cpu_percent = models.FloatField(default=0)
    #: Time the stage's workers were runnable but waiting for a CPU (100 = one worker all the
    #: time). The database default lets agents older than the field, and rows stored before
    #: it, read as 0: not measured.
    runqueue_percent = models.FloatField(default=0, db_default=0)
    rss_mb = models.FloatField(default=0)

    class Meta:
        indexes = [
            models.Index(fields=["sample", "stage"], name="stagesample_sample_stage"),
            models.Index(fields=["host", "ts"], name="stagesample_host_ts"),
        ]


class RankSample(models.Model):
    """One local rank's trainer within a host sample of a multi-rank host: DDP waits for the
    slowest rank, so each rank's throughput and idle time are kept."""

    sample = models.ForeignKey(HostSample, on_delete=models.CASCADE, related_name="rank_samples")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="+")
    ts = models.FloatField()
    rank = models.PositiveSmallIntegerField()
    throughput = models.FloatField()
    idle_fraction = models.FloatField()
    step_ms = models.FloatField(null=True, blank=True)
    wait_ms = models.FloatField(null=True, blank=True)
    # The rank's pipeline's workers per stage when it reported (the allocation it runs).
    workers = models.JSONField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["host", "ts"], name="ranksample_host_ts")]
