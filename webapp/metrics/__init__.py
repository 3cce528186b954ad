"""Prometheus metrics of the control plane (docs/monitoring.md).

- ``instruments``: what the web processes count as they serve (batches, ingestion latency, held
  long-polls), one call per view; prometheus-client's multiprocess mode adds up the processes.
- ``decisions``: what the Celery workers count (decisions and their latency), kept in Redis so
  that every web process on every machine reads the same figures.
- ``multiprocess``: the directory the web processes share, for gunicorn's hooks.
- ``scrape``: what is read when Prometheus scrapes (sessions by state from the database, Celery's
  queues and the decisions from Redis) and the exposition itself.
- ``views``: ``GET /metrics``, behind the API's token auth.
"""
