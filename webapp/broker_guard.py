"""Keep the Celery worker alive when Redis restarts.

celery 5.7.0's consumer, on losing the broker, collects the connection's transport and then
closes the connection; closing the redis channel restores unacknowledged messages through a
transport that is gone, raising ``AttributeError: 'NoneType' object has no attribute
'hostname'`` (kombu.transport.redis._connparams). That error is not a connection error, so it
escapes as "Unrecoverable error" and the worker process exits: one Redis restart stopped every
tuning session (tests/reliability/test_redis_restart_is_survived.py found it).

The guard treats that error as what it is, a failed close of a dead connection, and lets the
consumer reconnect as it does after any connection loss. Unacknowledged tasks are not lost:
Redis requeues them after the visibility timeout (tasks are acks_late and idempotent).

A task that was running when the connection went finishes after the consumer reconnected; its
late acknowledgement goes through the channel of the connection that is gone, and fails in the
same place (the hub loop calls ``Message.ack_log_error``, which logs only connection errors):
the worker exited again (tests/reliability/test_generated_fault_sequences_lose_nothing.py found
it, a worker restarted then Redis restarted under a running step). The guard logs that failed
acknowledgement instead: the consumer restored the message when the connection closed, so the
broker delivers it again and the task, idempotent, finds its work done.
"""

import logging

from celery.worker.consumer.consumer import Consumer
from kombu.message import Message

log = logging.getLogger(__name__)

_original = Consumer.on_connection_error_after_connected


def _on_connection_error_after_connected(self, exc):
    try:
        return _original(self, exc)
    except AttributeError as close_error:
        log.warning(
            "broker connection lost (%r); closing it failed (%r); reconnecting", exc, close_error
        )
        return None


def _connection_gone(message: Message) -> bool:
    """Whether the message came through a connection that was closed (its transport's client is
    gone: kombu.Connection._do_close_transport)."""
    transport = getattr(message.channel, "connection", None)
    return transport is None or getattr(transport, "client", None) is None


_original_ack = Message.ack_log_error
_original_reject = Message.reject_log_error


def _ack_log_error(self, logger, errors, multiple=False):
    try:
        return _original_ack(self, logger, errors, multiple=multiple)
    except AttributeError as exc:
        if not _connection_gone(self):
            raise
        log.warning(
            "could not acknowledge message %s: its broker connection is gone (%r); the broker "
            "delivers it again",
            self.delivery_tag,
            exc,
        )
        return None


def _reject_log_error(self, logger, errors, requeue=False):
    try:
        return _original_reject(self, logger, errors, requeue=requeue)
    except AttributeError as exc:
        if not _connection_gone(self):
            raise
        log.warning(
            "could not reject message %s: its broker connection is gone (%r); the broker "
            "delivers it again",
            self.delivery_tag,
            exc,
        )
        return None


def install() -> None:
    """Wrap the consumer's connection-loss handler and the late acknowledgement of messages
    (idempotent)."""
    if Consumer.on_connection_error_after_connected is not _on_connection_error_after_connected:
        Consumer.on_connection_error_after_connected = _on_connection_error_after_connected
    Message.ack_log_error = _ack_log_error
    Message.reject_log_error = _reject_log_error
