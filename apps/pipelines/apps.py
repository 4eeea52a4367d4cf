from django.apps import AppConfig


class PipelinesConfig(AppConfig):
    name = "apps.pipelines"
    label = "pipelines"
    verbose_name = "Pipelines and runs"

    def ready(self) -> None:
        from apps.artifacts import services as artifacts
        from apps.core import domain
        from apps.observability import metrics
        from apps.pipelines import gauges, services
        from apps.pipelines.delivery import revisions

        # Suspended runs wait on records and on agent commands: wake them when those settle.
        domain.subscribe(domain.RecordsSettled, services.runs_wake_on_records)
        domain.subscribe(domain.CommandFinished, services.runs_wake_on_command)
        # A lost worker's runs resume elsewhere at once, not when their leases expire.
        domain.subscribe(domain.WorkerLost, services.runs_take_over_on_worker_lost)
        metrics.gauges_register(gauges.run_gauges)
        # Revisions keep their archives in the artifacts' blob store: not orphans.
        artifacts.blob_holder_register(revisions.revision_blob_holders)
