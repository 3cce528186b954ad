"""A Redis that accepts connections and then never answers (paused, swapping, behind a
network that drops its packets) holds no request of the web app without a bound: publishing
an allocation, the health check and an agent's long-poll each return within a few seconds."""

import threading
import time

import pytest
from django.conf import settings

from tests.support.stalling_tcp import StallingServer
from webapp import pubsub

BOUND_S = 15.0  # the socket timeout (2 s) times redis-py's retries, with room for a busy CPU


@pytest.fixture
def stalled_redis():
    """A TCP server that accepts every connection and never says a word."""
    server = StallingServer()
    before = settings.REDIS_CLIENT_URL
    settings.REDIS_CLIENT_URL = server.url()
    pubsub._pool = None
    yield server.accepted
    server.close()
    settings.REDIS_CLIENT_URL = before
    pubsub._pool = None


def _bounded(fn, *args):
    """Run ``fn(*args)`` in a thread; fail if it outlasts ``BOUND_S``. Returns its outcome."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn(*args)
        except Exception as exc:  # looked at by the test
            outcome["error"] = exc

    began = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"{fn.__name__} was still waiting on Redis after {BOUND_S} s"
    return outcome, time.monotonic() - began


def test_publishing_an_allocation_gives_up_on_a_stalled_redis(stalled_redis):
    outcome, _ = _bounded(pubsub.publish_allocation, 1, 2)
    assert stalled_redis, "the client never reached the stalled server"
    assert outcome == {"value": None}  # logged, not raised: agents re-read on their timeout


def test_the_health_checks_ping_fails_on_a_stalled_redis(stalled_redis):
    outcome, _ = _bounded(lambda: pubsub.client().ping())
    assert isinstance(outcome.get("error"), pubsub.redis.TimeoutError), outcome


def test_a_long_poll_on_a_stalled_redis_ends_near_its_wait(stalled_redis):
    outcome, took = _bounded(pubsub.wait_for_newer_version, 1, 5, 1.0, lambda: 5)
    assert outcome == {"value": 5}
    assert took < 1.0 + BOUND_S
