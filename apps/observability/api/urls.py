"""Routes under /api/v1/ that belong to observability (next to the records' and runs' own)."""

from django.urls import path

from apps.observability.api.views import RecordMetricsView, RunTraceView

urlpatterns = [
    path("records/<str:pk>/metrics/", RecordMetricsView.as_view(), name="record-metrics"),
    path("runs/<str:pk>/trace/", RunTraceView.as_view(), name="run-trace"),
]
