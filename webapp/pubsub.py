"""Redis pub/sub that wakes agents' allocation long-polls the moment a version is published."""

import logging
import threading
import time
from collections.abc import Callable

import redis
from django.conf import settings

log = logging.getLogger(__name__)

_pool_lock = threading.Lock()
_pool: redis.ConnectionPool | None = None

# How long one Redis command may take. Redis answers in milliseconds; a server that accepted
# the connection and then stalls (paused, swapping, a network that drops its packets) held a
# request thread in publish() or ping() without a bound. A pub/sub wait passes its own
# timeout, which this does not shorten.
SOCKET_TIMEOUT_S = 2.0
# Every Redis client of the web app: a connection attempt bounded, an idle connection checked
# before it is used again (the agents' ASGI front's subscription takes these too).
CONNECTION_OPTIONS = {"socket_connect_timeout": 2, "health_check_interval": 30}


def client() -> redis.Redis:
    """A client on this process's shared connection pool."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = redis.ConnectionPool.from_url(
                settings.REDIS_CLIENT_URL, socket_timeout=SOCKET_TIMEOUT_S, **CONNECTION_OPTIONS
            )
    return redis.Redis(connection_pool=_pool)


def allocation_channel(host_id: int) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:host:{host_id}:allocation"


def publish_allocation(host_id: int, version: int) -> None:
    """Announce a new allocation version. A Redis outage only delays agents: they re-read the
    database when their long-poll times out, so the error is logged, not raised."""
    try:
        client().publish(allocation_channel(host_id), str(version))
    except redis.RedisError as exc:
        log.warning("could not publish allocation v%s of host %s: %s", version, host_id, exc)


def publish_host_gone(host_id: int) -> None:
    """Wake the host's held long-polls: it was deleted (with its job). They answer 204 at once
    rather than at the end of their wait, and the agent's next request is a 401."""
    try:
        client().publish(allocation_channel(host_id), "gone")
    except redis.RedisError as exc:
        log.warning("could not wake the long-polls of deleted host %s: %s", host_id, exc)


def wait_for_newer_version(
    host_id: int, after: int, wait_s: float, current_version: Callable[[], int]
) -> int:
    """Block until the host's allocation version exceeds ``after`` or ``wait_s`` passes.

    Subscribes first and reads the database second, so a version published between the two is
    never missed. The wait blocks on the subscription's socket: no polling loop. Returns the
    newest version seen (which may still be ``<= after`` when the wait ran out).
    """
    try:
        pubsub = client().pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(allocation_channel(host_id))
    except redis.RedisError as exc:
        # Degraded: without pub/sub, hold a short while and read the database once, so agents
        # neither spin nor wait the whole period for a version that may already be there.
        log.warning("long-poll of host %s without pub/sub (%s)", host_id, exc)
        version = current_version()
        if version <= after:
            time.sleep(min(wait_s, 5.0))
            version = current_version()
        return version
    try:
        version = current_version()
        deadline = time.monotonic() + wait_s
        while version <= after:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                message = pubsub.get_message(timeout=remaining)
            except redis.RedisError as exc:
                log.warning("long-poll of host %s lost pub/sub (%s)", host_id, exc)
                time.sleep(min(max(deadline - time.monotonic(), 0), 5.0))
                return current_version()
            if message is not None:
                version = current_version()
        return version
    finally:
        try:
            pubsub.close()
        except redis.RedisError:
            pass
