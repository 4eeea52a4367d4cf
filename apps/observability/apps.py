from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "apps.observability"
    label = "observability"
    verbose_name = "Observability"

    def ready(self) -> None:
        from apps.observability import subscribers

        subscribers.subscribe()
