"""Decisions and their latency, counted in Redis by the Celery workers that take them.

Workers may run on other machines than the web processes, so their counts cannot live in the web
tier's files: each decision adds to one Redis hash (one round trip: the sum and the
bucket, in one transaction), and every web process reads that hash when Prometheus scrapes (webapp/metrics/
scrape.py). The histogram is kept as per-bucket counts, made cumulative when read.
"""

import logging
import threading

import redis
from django.conf import settings

log = logging.getLogger(__name__)

# A decision reads a window of samples, runs the policy and stores an allocation: tens of
# milliseconds on a small host, seconds for a large network on a busy worker.
DECISION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# A scrape or a decision must never hang on Redis: half a second to connect, half to answer.
REDIS_TIMEOUT_S = 0.5

_pools: dict[str, redis.ConnectionPool] = {}
_pools_lock = threading.Lock()


def client() -> redis.Redis:
    """A client with short timeouts on this process's pool for the current REDIS_URL."""
    url = settings.REDIS_CLIENT_URL
    with _pools_lock:
        pool = _pools.get(url)
        if pool is None:
            pool = _pools[url] = redis.ConnectionPool.from_url(
                url, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S
            )
    return redis.Redis(connection_pool=pool)


def decisions_key() -> str:
    return f"{settings.REDIS_KEY_PREFIX}:metrics:decisions"


def bucket_field(seconds: float) -> str:
    """The hash field of the bucket ``seconds`` falls in (its upper bound, or +Inf)."""
    for bound in DECISION_BUCKETS:
        if seconds <= bound:
            return f"le:{bound}"
    return "le:+Inf"


def record_decision(seconds: float) -> None:
    """Count one decision that took ``seconds``. A Redis outage loses the count, never the
    decision: the error is logged, not raised."""
    try:
        pipe = client().pipeline(transaction=True)  # one round trip, both or neither
        pipe.hincrbyfloat(decisions_key(), "sum", seconds)
        pipe.hincrby(decisions_key(), bucket_field(seconds), 1)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("could not count a decision in Redis: %s", exc)


def read_decisions(fields: dict[bytes, bytes]) -> tuple[float, list[tuple[str, int]]]:
    """The sum and the cumulative buckets (Prometheus's ``le`` labels, the last one ``+Inf``, the
    count) of the hash's ``fields`` as HGETALL returns them."""
    values = {key.decode(): value for key, value in fields.items()}
    total = float(values.get("sum", 0.0))
    buckets, running = [], 0
    for bound in DECISION_BUCKETS:
        running += int(values.get(f"le:{bound}", 0))
        buckets.append((str(float(bound)), running))
    running += int(values.get("le:+Inf", 0))
    buckets.append(("+Inf", running))
    return total, buckets
