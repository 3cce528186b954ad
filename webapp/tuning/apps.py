from django.apps import AppConfig


class TuningConfig(AppConfig):
    name = "webapp.tuning"
    label = "tuning"

    def ready(self) -> None:
        # Connects the receiver that queues a started session's first task, in every process
        # that starts sessions (web, management commands), not only in Celery workers.
        from . import tasks  # noqa: F401
