"""Stands over REST: what each pipeline's stand holds, with TTLs; extend or release a holding."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.params import MAX_SECONDS, DoorChecks, StrictInteger
from apps.api.permissions import request_namespace
from apps.core import access
from apps.pipelines import selectors, services
from apps.records import services as records
from apps.records.api.serializers import RecordOutput
from apps.records.models import Record


class HoldingInput(serializers.Serializer):
    record = serializers.UUIDField(help_text="a record the stand holds directly")


class ExtendHoldingInput(HoldingInput):
    by_seconds = StrictInteger(min_value=1, max_value=MAX_SECONDS)


StandSummary = inline_serializer(
    "StandSummary",
    many=True,
    fields={
        "pipeline": serializers.CharField(),
        "namespace": serializers.CharField(help_text="the stand's namespace: its pipeline's"),
        "id": serializers.UUIDField(),
        "holdings": serializers.IntegerField(),
        "records": serializers.IntegerField(),
    },
)


class StandHoldingOutput(RecordOutput):
    """A record the stand holds directly, with the size of its subtree."""

    # Counted by the query that lists it (selectors.stand_holdings).
    subtree_records = serializers.IntegerField(read_only=True, help_text="records in its subtree, itself included")

    class Meta(RecordOutput.Meta):
        fields = [*RecordOutput.Meta.fields, "subtree_records"]
        read_only_fields = fields


StandDetail = inline_serializer(
    "StandDetail",
    fields={
        "pipeline": serializers.CharField(),
        "namespace": serializers.CharField(help_text="the stand's namespace: its pipeline's, where its runs hand over"),
        "id": serializers.UUIDField(allow_null=True, help_text="null until something is handed to the stand"),
        "holdings": StandHoldingOutput(many=True),
    },
)


def _holding(request: Request, pipeline: str, data: dict[str, Any]) -> Record:
    definition = services.definition_get(pipeline, user=request.user)
    access.require(request.user, "update", "stands", definition.namespace)
    return selectors.stand_holding(
        user=request.user, pipeline=definition.name, record_id=data["record"], namespace=definition.namespace
    )


class StandViewSet(DoorChecks, viewsets.ViewSet):
    """Each pipeline's stand: the subtrees runs handed over, each with its own TTL."""

    lookup_field = "pipeline"
    lookup_value_regex = r"[A-Za-z0-9_.-]+"
    access_resource = "stands"
    access_verbs = {"list": "list", "retrieve": "get", "extend": "update", "release": "update"}

    @extend_schema(
        parameters=[OpenApiParameter("namespace", str, description="the stands of this namespace")],
        responses=StandSummary,
    )
    def list(self, request: Request) -> Response:
        """The stands, by pipeline; in every namespace the caller may see, or ``?namespace=``'s."""
        summaries = selectors.stand_list(user=request.user, namespace=request_namespace(request))
        return Response(
            [
                {
                    "pipeline": s.stand.name,
                    "namespace": s.stand.namespace,
                    "id": str(s.stand.pk),
                    "holdings": s.holdings,
                    "records": s.records,
                }
                for s in summaries
            ]
        )

    @extend_schema(operation_id="v1_stands_retrieve", responses=StandDetail)
    def retrieve(self, request: Request, pipeline: str) -> Response:
        """What the stand holds. A pipeline whose stand has held nothing yet has none: its ``id``
        is null (a GET makes nothing; the stand is made when something is handed to it)."""
        definition = services.definition_get(pipeline, user=request.user)  # 404 for a pipeline not loaded
        stand = selectors.stand_find(user=request.user, pipeline=definition.name, namespace=definition.namespace)
        holdings = selectors.stand_holdings(user=request.user, stand=stand) if stand else []
        items = StandHoldingOutput(holdings, many=True).data
        return Response(
            {
                "pipeline": pipeline,
                "namespace": definition.namespace,
                "id": str(stand.pk) if stand else None,
                "holdings": items,
            }
        )

    @extend_schema(request=ExtendHoldingInput, responses=RecordOutput)
    @action(detail=True, methods=["post"])
    def extend(self, request: Request, pipeline: str) -> Response:
        """Push a holding's expiry further."""
        data = ExtendHoldingInput(data=request.data)
        data.is_valid(raise_exception=True)
        record = _holding(request, pipeline, data.validated_data)
        by = timedelta(seconds=data.validated_data["by_seconds"])
        return Response(RecordOutput(records.record_extend(record=record, by=by, actor=request.user)).data)

    @extend_schema(request=HoldingInput, responses=RecordOutput)
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pipeline: str) -> Response:
        """Release a holding from its TTL: it stays until deleted (DELETE /api/v1/records/{id}/)."""
        data = HoldingInput(data=request.data)
        data.is_valid(raise_exception=True)
        record = _holding(request, pipeline, data.validated_data)
        return Response(RecordOutput(records.record_release(record=record, actor=request.user)).data)
