from django.apps import AppConfig


class SourcesConfig(AppConfig):
    name = "sources"
    verbose_name = "Data sources"

    def ready(self) -> None:
        # Register the ingestion tasks in every process (web, worker, manage.py): the scheduler
        # queues them by name (sources.scheduling.INGEST_TASK), not by importing them.
        from sources import tasks  # noqa: F401
