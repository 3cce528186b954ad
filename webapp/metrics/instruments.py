"""What the web processes measure as they serve: one call per view, cheap on the hot path.

In gunicorn, ``PROMETHEUS_MULTIPROC_DIR`` is set before the workers import this module
(webapp/metrics/multiprocess.py), so each value lives in a memory-mapped file of its process and
the scrape adds up every process's files. In one process (runserver, the tests) the values live in
this module's registry.
"""

from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

# Not the default registry: in multiprocess mode the scrape reads the files, and these objects
# must not be collected a second time from memory.
REGISTRY = CollectorRegistry(auto_describe=True)
# One process answers as several do: without the ``_created`` series that multiprocess mode lacks.
disable_created_metrics()

# The ingestion target is a p99 under 100 ms: buckets fine below it, coarse above.
INGESTION_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

BATCHES = Counter(
    "intune_ingested_batches",
    "Agents' metric batches stored (answered 200)",
    registry=REGISTRY,
)
SAMPLES = Counter(
    "intune_ingested_samples",
    "Samples stored from agents' batches (duplicates of stored ones not counted)",
    registry=REGISTRY,
)
REFUSED = Counter(
    "intune_refused_batches",
    "Agents' metric batches refused, by the HTTP status answered "
    "(400 invalid, 401/403 token, 409 sequence conflict, 429 rate limited)",
    ["status"],
    registry=REGISTRY,
)
INGESTION_SECONDS = Histogram(
    "intune_ingestion_seconds",
    "Server-side time of an agent's POST /api/v1/hosts/{id}/metrics/ (token check, parsing, "
    "validation, storing), accepted or refused",
    buckets=INGESTION_BUCKETS,
    registry=REGISTRY,
)
# The usual refusals are there from the start, at 0, so that a rate() of them is 0, not absent.
for _status in ("400", "401", "403", "409", "429"):
    REFUSED.labels(_status)

HELD_LONG_POLLS = Gauge(
    "intune_held_long_polls",
    "Allocation long-polls waiting for a newer version now",
    multiprocess_mode="livesum",
    registry=REGISTRY,
)


def observe_batch(status: int, stored_samples: int, seconds: float) -> None:
    """Count one answered POST of a metrics batch: ``status`` is the HTTP status answered,
    ``stored_samples`` the samples it stored, ``seconds`` its server-side time."""
    INGESTION_SECONDS.observe(seconds)
    if status == 200:
        BATCHES.inc()
        if stored_samples:
            SAMPLES.inc(stored_samples)
    else:
        REFUSED.labels(str(status)).inc()


@contextmanager
def held_long_poll() -> Iterator[None]:
    """``with held_long_poll():`` around the wait of an allocation long-poll."""
    HELD_LONG_POLLS.inc()
    try:
        yield
    finally:
        HELD_LONG_POLLS.dec()
