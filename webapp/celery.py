"""The Celery application, configured from Django settings under the ``CELERY_`` namespace."""

import os

from celery import Celery
from celery.signals import setup_logging, worker_init

from .broker_guard import install as install_broker_guard

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("webapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# A Redis restart must not end the worker process (see webapp/broker_guard.py).
install_broker_guard()


@setup_logging.connect
def use_the_django_logging_settings(loglevel: int | str | None = None, **_: object) -> None:
    """The worker and beat log as the web processes do (settings.LOGGING: one line per record)
    instead of Celery's own format, at the level of their ``--loglevel``."""
    import logging
    from logging.config import dictConfig

    from django.conf import settings

    dictConfig(settings.LOGGING)
    if loglevel:
        logging.getLogger().setLevel(loglevel)


@worker_init.connect
def import_the_tuner_before_the_first_task(**_: object) -> None:
    """A worker runs tuning steps: it imports torch (through :mod:`tuner.control`) when it
    starts, before its pool forks, as it did when ``import tuner`` imported torch. Left to the
    first step, the import ran inside the step's transaction with the session row locked: 1.5 to
    4 s on a loaded machine, and an agent's batch waiting on that row past the lock timeout was
    answered 503 (tests/e2e/test_worker_killed_mid_session.py, with the replacement worker). The
    web processes, beat and management commands do not import it (tuner/__init__.py).

    An optimizer is made once too: torch's first ``torch.optim.Adam`` imports ``torch._dynamo``
    and some 800 modules more (1.4 s on a quiet machine), and a fresh worker's first tuning step
    that paid it at load 14 passed its 30 s soft time limit (the killed-worker test, once)."""
    import torch

    import tuner.control  # noqa: F401

    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
