from django.apps import AppConfig


class IngestionConfig(AppConfig):
    name = "webapp.ingestion"
    label = "ingestion"

    def ready(self) -> None:
        from webapp.jobs.services import provide_budget_summary

        from .services import budget_summary

        provide_budget_summary(budget_summary)
