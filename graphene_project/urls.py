from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from apps.agents import views as agent_views
from apps.api import errors as api_errors
from apps.core import views as core_views
from apps.observability.views import metrics_view
from apps.pipelines import views as pipeline_views  # observability: /metrics

urlpatterns = [
    path("healthz", core_views.healthz, name="healthz"),
    path("readyz", core_views.readyz, name="readyz"),
    path("tls/ca.pem", core_views.tls_ca, name="tls-ca"),
    path("metrics", metrics_view, name="metrics"),  # observability: Prometheus exposition
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # Swagger UI over the schema, its files from drf-spectacular-sidecar (served here, no CDN).
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/", include("apps.observability.api.urls")),  # observability: record metrics, run traces
    path("api/v1/", include("apps.api.urls")),
    # Anything else under /api/ is the API's JSON 404 (not the Studio's catch-all login redirect).
    re_path(r"^api(?:/|$)", api_errors.not_found),
    path("agents/download", agent_views.download, name="agents-download"),
    path("hooks/<str:pipeline>/<str:trigger>", pipeline_views.webhook, name="webhook"),
    path("", admin.site.urls),
]

# Django's own error answers: in the API's JSON shape under /api/, its HTML pages elsewhere.
handler400 = api_errors.bad_request
handler403 = api_errors.permission_denied
handler404 = api_errors.page_not_found
handler500 = api_errors.server_error
