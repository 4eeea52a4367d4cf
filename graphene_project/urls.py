from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from apps.agents import views as agent_views
from apps.core import views as core_views
from apps.observability.views import metrics_view  # observability: /metrics

urlpatterns = [
    path("healthz", core_views.healthz, name="healthz"),
    path("readyz", core_views.readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),  # observability: Prometheus exposition
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/v1/", include("apps.observability.api.urls")),  # observability: record metrics, run traces
    path("api/v1/", include("apps.api.urls")),
    path("agents/download", agent_views.download, name="agents-download"),
    path("", admin.site.urls),
]
