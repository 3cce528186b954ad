"""The Celery application, configured from Django settings under the ``CELERY_`` namespace."""

import os

from celery import Celery
from celery.signals import setup_logging

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
