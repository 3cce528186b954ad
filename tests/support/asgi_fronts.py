"""Helpers for tests that drive the agents' ASGI front (webapp/agent_asgi.py) in process."""

import threading

from django.db import connection


def close_front_pool(front) -> None:
    """Close the database connection each of the front's pool threads keeps (the lean paths
    keep one a thread), then the pool: every thread is held at a barrier so that each runs one
    close. Bounded: the barrier waits 10 s, each close 20 s."""
    workers = front.pool._max_workers
    barrier = threading.Barrier(workers)

    def close():
        barrier.wait(timeout=10)
        connection.close()

    for future in [front.pool.submit(close) for _ in range(workers)]:
        future.result(timeout=20)
    front.pool.shutdown(wait=True)
