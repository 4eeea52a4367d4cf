from django.apps import AppConfig


class RecordsConfig(AppConfig):
    name = "apps.records"
    label = "records"
    verbose_name = "Records"

    def ready(self) -> None:
        from apps.core import domain
        from apps.records.services import housekeeping

        # A lost worker's convergences and deletions go on elsewhere at once.
        domain.subscribe(domain.WorkerLost, housekeeping.records_take_over_on_worker_lost)
