"""What the tuning app announces. Its services send; its tasks listen, so that the services,
which the tasks call, need not import the tasks."""

from django.dispatch import Signal

session_started = Signal()
"""Sent once a started session is committed, with ``session`` (a TuningSession) and ``pretrain``
(whether it learns the host's twin first); ``webapp.tuning.tasks`` queues its first task."""
