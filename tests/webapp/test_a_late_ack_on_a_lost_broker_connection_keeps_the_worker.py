"""A task that finishes after the worker lost its broker connection acknowledges its message
through the channel of that dead connection. kombu fails there with an AttributeError, not a
connection error, and the worker exited ("Unrecoverable error"): the generated fault test
(tests/reliability/test_generated_fault_sequences_lose_nothing.py) found it, Redis restarted
under a running tuning step. With the broker guard installed the failure is logged and the
message is left to the broker, which delivers it again."""

import logging
import uuid

import kombu
import pytest

from webapp import broker_guard


def a_message_of_a_lost_connection(redis_url: str, cleanup: list):
    """A message received with a late acknowledgement, then its connection gone as the Celery
    consumer leaves it when Redis goes away: the channel's pools disconnected and the
    transport's client cleared (what kombu.Connection._do_close_transport does). These two
    lines stand in for killing Redis under the worker, which the generated fault test does."""
    connection = kombu.Connection(redis_url)
    channel = connection.default_channel
    queue = kombu.Queue(f"late-ack-{uuid.uuid4().hex[:8]}", channel=channel)
    queue.declare()
    kombu.Producer(channel).publish({"step": 1}, routing_key=queue.name)
    message = queue.get(no_ack=False)
    assert message is not None
    errors = connection.connection_errors + connection.channel_errors
    channel._disconnect_pools()
    connection.transport.client = None
    cleanup.append((connection, queue.name))
    return message, errors


@pytest.fixture
def cleanup(redis_url):
    names = []
    yield names
    import redis

    client = redis.Redis.from_url(redis_url)
    for connection, name in names:
        # Back to a live connection: closing it restores the unacknowledged message (kombu
        # would try at exit otherwise, and print the same AttributeError), then it goes.
        connection.transport.client = connection
        connection.release()
        client.delete(name)
    client.close()


def test_kombu_alone_raises_on_a_late_ack_of_a_lost_connection(redis_url, cleanup, monkeypatch):
    # The failure the guard exists for, shown on kombu's own method.
    monkeypatch.setattr(kombu.message.Message, "ack_log_error", broker_guard._original_ack)
    message, errors = a_message_of_a_lost_connection(redis_url, cleanup)
    with pytest.raises(AttributeError, match="hostname"):
        message.ack_log_error(logging.getLogger("test"), errors)


def test_the_guard_logs_a_late_ack_of_a_lost_connection_and_goes_on(redis_url, cleanup, caplog):
    broker_guard.install()
    message, errors = a_message_of_a_lost_connection(redis_url, cleanup)
    with caplog.at_level(logging.WARNING, logger="webapp.broker_guard"):
        assert message.ack_log_error(logging.getLogger("test"), errors) is None
        assert message.reject_log_error(logging.getLogger("test"), errors) is None
    assert "its broker connection is gone" in caplog.text
    assert not message.acknowledged  # left to the broker, which delivers it again


def test_the_guard_still_raises_an_attribute_error_of_a_live_connection(redis_url, monkeypatch):
    broker_guard.install()

    def broken(self, multiple=False):
        raise AttributeError("a bug, not a lost connection")

    monkeypatch.setattr(kombu.message.Message, "ack", broken)
    connection = kombu.Connection(redis_url)
    message = kombu.message.Message(channel=connection.default_channel, body=b"{}")
    with pytest.raises(AttributeError, match="a bug"):
        message.ack_log_error(logging.getLogger("test"), ())
    connection.release()
