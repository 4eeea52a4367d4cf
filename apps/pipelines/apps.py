from django.apps import AppConfig


class PipelinesConfig(AppConfig):
    name = "apps.pipelines"
    label = "pipelines"
    verbose_name = "Pipelines and runs"

    def ready(self) -> None:
        from apps.core import domain
        from apps.observability import metrics
        from apps.pipelines import gauges, services

        # Suspended runs wait on records and on agent commands: wake them when those settle.
        domain.subscribe(domain.RecordsSettled, services.runs_wake_on_records)
        domain.subscribe(domain.CommandFinished, services.runs_wake_on_command)
        metrics.gauges_register(gauges.run_gauges)
