"""Metrics and traces over REST: a record's series (``records/{id}/metrics/``) and a run's
span tree (``runs/{id}/trace/``). Thin: parameters in, a selector, the body out."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.api import schema as api_schema
from apps.api.params import DoorChecks, datetime_param
from apps.observability import selectors
from apps.observability.services import METRIC_NAME
from apps.pipelines import selectors as run_selectors
from apps.records import selectors as record_selectors

_Point = inline_serializer(
    "MetricBucket",
    many=True,
    fields={
        "at": serializers.DateTimeField(help_text="the bucket's start (aligned to the step since the Unix epoch)"),
        "count": serializers.IntegerField(),
        "avg": serializers.FloatField(),
        "min": serializers.FloatField(),
        "max": serializers.FloatField(),
        "last": serializers.FloatField(),
    },
)
_Series = inline_serializer(
    "MetricSeries",
    many=True,
    fields={"name": serializers.CharField(), "labels": serializers.DictField(), "points": _Point},
)
_MetricsOutput = inline_serializer(
    "RecordMetrics",
    fields={
        "record": serializers.UUIDField(),
        "name": serializers.CharField(allow_null=True),
        "start": serializers.DateTimeField(),
        "end": serializers.DateTimeField(),
        "window_seconds": serializers.IntegerField(),
        "step_seconds": serializers.IntegerField(),
        "names": serializers.ListField(child=serializers.CharField()),
        "series": _Series,
        "truncated": serializers.BooleanField(),
    },
)
_TraceOutput = inline_serializer(
    "RunTrace",
    fields={
        "run": serializers.UUIDField(),
        "trace_id": serializers.CharField(),
        "span_count": serializers.IntegerField(),
        "errors": serializers.IntegerField(),
        "truncated": serializers.BooleanField(),
        "root": serializers.DictField(help_text="a span with its children (the same shape, recursively)"),
    },
)


class RecordMetricsView(DoorChecks, APIView):
    """A record's metric series in a window, aggregated per step."""

    path_ids = {"pk": "record"}
    access_resource = "records"
    access_verbs = {"get": "get"}

    @extend_schema(
        operation_id="records_metrics",
        parameters=[
            OpenApiParameter(
                "name",
                {"type": "string", "pattern": f"^{METRIC_NAME.pattern}$"},
                description="one series name (default: every name the record has)",
            ),
            OpenApiParameter(
                "window",
                {"type": "string", "pattern": selectors.DURATION_PATTERN},
                description="how far back from end: 90s, 15m, 1h (default), 1h30m, 7d, or seconds",
            ),
            OpenApiParameter(
                "step",
                {"type": "string", "pattern": selectors.DURATION_PATTERN},
                description="bucket width: 10s, 60s (default, larger for long windows)",
            ),
            api_schema.datetime_param("end", "ISO 8601 end of the window (default now)"),
        ],
        responses=_MetricsOutput,
    )
    def get(self, request: Request, pk: str) -> Response:
        record = record_selectors.record_get(user=request.user, record_id=pk)
        params = request.query_params
        query = selectors.series_query(
            name=params.get("name") or None,
            window=params.get("window") or None,
            step=params.get("step") or None,
            end=datetime_param(params, "end"),
            now=timezone.now(),
        )
        body: dict[str, Any] = selectors.metric_series(record=record, query=query)
        return Response(body)


class RunTraceView(DoorChecks, APIView):
    """A run's trace: the span tree of its executions, steps, convergences, deletions and commands."""

    path_ids = {"pk": "run"}
    access_resource = "runs"
    access_verbs = {"get": "get"}

    @extend_schema(operation_id="runs_trace", responses=_TraceOutput)
    def get(self, request: Request, pk: str) -> Response:
        run = run_selectors.run_get(user=request.user, run_id=pk)
        return Response(run_selectors.run_trace(run=run))
