"""What a scrape reads besides the web processes' own counts: the database (sessions by state,
hosts by status) and Redis (Celery's queues, the workers' decisions), each read once per scrape,
each allowed to fail alone: the answer then says so (``intune_redis_up 0``) and carries the rest.
"""

import logging

import redis
from django.conf import settings
from django.db import DatabaseError
from django.db.models import Count
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from webapp.jobs.models import Host
from webapp.tuning.models import TuningSession

from . import instruments, multiprocess
from .decisions import client, decisions_key, read_decisions

log = logging.getLogger(__name__)

# kombu's Redis transport keeps a queue as one list per priority step: the queue's own name for
# priority 0, "<name>\x06\x16<step>" for the others (kombu.transport.redis: PRIORITY_STEPS, sep).
KOMBU_PRIORITY_STEPS = (0, 3, 6, 9)
KOMBU_PRIORITY_SEP = "\x06\x16"


def celery_queue_keys(queue: str) -> list[str]:
    """The Redis lists that hold ``queue``'s waiting tasks, under the broker's key prefix."""
    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "")
    return [
        f"{prefix}{queue}" + (f"{KOMBU_PRIORITY_SEP}{step}" if step else "")
        for step in KOMBU_PRIORITY_STEPS
    ]


def celery_unacked_key() -> str:
    """The hash of tasks handed to a worker and not yet acknowledged (kombu's ``unacked``)."""
    return settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "") + "unacked"


class DatabaseCollector:
    """Tuning sessions by state and hosts by status, counted by one query each."""

    def collect(self):
        sessions = GaugeMetricFamily(
            "intune_tuning_sessions", "Tuning sessions by state", labels=["state"]
        )
        hosts = GaugeMetricFamily("intune_hosts", "Registered hosts by status", labels=["status"])
        try:
            by_state = _count_by(TuningSession, "status", TuningSession.Status.values)
            by_status = _count_by(Host, "status", Host.Status.values)
        except DatabaseError as exc:
            log.warning("metrics scrape could not read the database: %s", exc)
            return
        for state, n in by_state.items():
            sessions.add_metric([state], n)
        for status, n in by_status.items():
            hosts.add_metric([status], n)
        yield sessions
        yield hosts


def _count_by(model, field: str, values: list[str]) -> dict[str, int]:
    counts = dict.fromkeys(values, 0)
    for row in model.objects.order_by().values(field).annotate(n=Count("pk")):
        counts[row[field]] = row["n"]
    return counts


class RedisCollector:
    """Celery's queue depth and the decisions the workers counted, in one round trip with a
    bounded timeout (webapp/metrics/decisions.py: REDIS_TIMEOUT_S)."""

    def collect(self):
        up = GaugeMetricFamily(
            "intune_redis_up",
            "1 when this scrape could read Redis (Celery's queues, the decisions), else 0",
        )
        queue = settings.CELERY_TASK_DEFAULT_QUEUE
        keys = celery_queue_keys(queue)
        try:
            pipe = client().pipeline(transaction=False)
            for key in keys:
                pipe.llen(key)
            pipe.hlen(celery_unacked_key())
            pipe.hgetall(decisions_key())
            *lengths, unacked, decision_fields = pipe.execute()
        except redis.RedisError as exc:
            log.warning("metrics scrape could not read Redis: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        waiting = GaugeMetricFamily(
            "intune_celery_queue_length",
            "Tasks waiting in a Celery queue (all priorities)",
            labels=["queue"],
        )
        waiting.add_metric([queue], sum(lengths))
        yield waiting
        yield GaugeMetricFamily(
            "intune_celery_unacked_tasks",
            "Tasks handed to a worker and not yet acknowledged (running, or held for a countdown)",
            value=unacked,
        )
        total, buckets = read_decisions(decision_fields)
        yield CounterMetricFamily(
            "intune_decisions", "Tuning decisions taken by the Celery workers", value=buckets[-1][1]
        )
        yield HistogramMetricFamily(
            "intune_decision_seconds",
            "Time of a tuning step that decided, in the worker: reading the window, the policy's "
            "decision, storing the allocation and the checkpoint",
            buckets=buckets,
            sum_value=total,
        )


class _InProcess:
    """The web process's own instruments, when it is the only process (no shared directory)."""

    def collect(self):
        return instruments.REGISTRY.collect()


def exposition() -> bytes:
    """The scrape's answer in Prometheus's text format."""
    registry = CollectorRegistry()
    if multiprocess.enabled():
        MultiProcessCollector(registry)
    else:
        registry.register(_InProcess())
    registry.register(DatabaseCollector())
    registry.register(RedisCollector())
    return generate_latest(registry)
