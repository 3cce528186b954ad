"""A Redis that stops answering while the agents' ASGI front is subscribed (paused, swapping, a
network that drops its packets) is noticed within seconds: the subscription is marked down, the
held long-polls are woken to re-read the database (and then every DEGRADED_RECHECK_S), and the
subscription comes back once Redis answers again. Before, ``get_message`` returned None every
10 s on the silent socket forever: the subscription looked up, and held long-polls were never
woken by a version published meanwhile nor told to re-read the database."""

import asyncio
import time
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings

from tests.support.stalling_tcp import StallingServer
from webapp import pubsub
from webapp.agent_asgi import SUBSCRIPTION_SILENCE_LIMIT_S, AllocationWaker

# The limit plus a ping's round and a busy CPU's delay.
NOTICED_WITHIN_S = SUBSCRIPTION_SILENCE_LIMIT_S + 3.0


@pytest.fixture
def proxied_redis():
    """The session's Redis behind a TCP proxy that can be made to stop answering."""
    real = settings.REDIS_CLIENT_URL
    parts = urlsplit(real)
    if parts.scheme != "redis":
        pytest.skip("the proxy forwards TCP; this Redis is reached by a unix socket")
    server = StallingServer(upstream=(parts.hostname, parts.port or 6379))
    settings.REDIS_CLIENT_URL = server.url(int(parts.path.strip("/") or 0))
    yield server, redis.Redis.from_url(real, socket_timeout=2)
    server.close()
    settings.REDIS_CLIENT_URL = real


async def _until(condition, bound_s: float, what: str) -> float:
    began = time.monotonic()
    while not condition():
        assert time.monotonic() - began < bound_s, f"{what} not within {bound_s} s"
        await asyncio.sleep(0.05)
    return time.monotonic() - began


async def _woken_by_a_publish(waker: AllocationWaker, direct: redis.Redis, host_id: int) -> None:
    future = waker.register(host_id)
    direct.publish(pubsub.allocation_channel(host_id), "2")
    await asyncio.wait_for(future, 5)


def test_a_stalled_redis_is_noticed_held_polls_are_woken_and_the_subscription_returns(
    proxied_redis,
):
    server, direct = proxied_redis

    async def scenario():
        waker = AllocationWaker()
        waker.start()
        try:
            await _until(lambda: waker.connected, 10, "the first subscription")
            await _woken_by_a_publish(waker, direct, 1)
            held = waker.register(2)
            server.stall()
            took = await _until(lambda: not waker.connected, NOTICED_WITHIN_S, "the stall noticed")
            # Woken to re-read the database, and (not connected) to do so every few seconds.
            await asyncio.wait_for(held, 1)
            server.resume()
            await _until(lambda: waker.connected, 15, "the subscription back")
            await _woken_by_a_publish(waker, direct, 3)
            return took
        finally:
            await waker.stop()

    took = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert took < NOTICED_WITHIN_S
