from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "apps.agents"
    label = "agents"
    verbose_name = "Agents"

    def ready(self) -> None:
        from apps.agents import gauges, services
        from apps.core import domain
        from apps.observability import metrics

        # A kind's call on a machine ended: its record's convergence or deletion goes on.
        domain.subscribe(domain.CommandFinished, services.record_wake_on_command)
        metrics.gauges_register(gauges.agent_gauges)
