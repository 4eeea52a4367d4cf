from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "apps.agents"
    label = "agents"
    verbose_name = "Agents"

    def ready(self) -> None:
        from apps.agents import gauges, services
        from apps.agents.machine import AgentMachines
        from apps.core import domain
        from apps.observability import metrics
        from kinds.machine import install

        # A kind's call on a machine ended: its record's convergence or deletion goes on.
        domain.subscribe(domain.CommandFinished, services.record_wake_on_command)
        metrics.gauges_register(gauges.agent_gauges)
        # Kinds reach agents' machines through ``kinds.machine`` only; this app is what answers.
        install(AgentMachines())
