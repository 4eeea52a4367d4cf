"""Stands over REST: what each pipeline's stand holds, with TTLs; extend or release a holding."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Count
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.core.errors import ValidationFailed
from apps.pipelines import selectors, services
from apps.records import selectors as record_selectors
from apps.records import services as records
from apps.records.api.serializers import RecordOutput
from apps.records.choices import Phase
from apps.records.models import Record


class HoldingInput(serializers.Serializer):
    record = serializers.UUIDField(help_text="a record the stand holds directly")


class ExtendHoldingInput(HoldingInput):
    by_seconds = serializers.IntegerField(min_value=1)


StandSummary = inline_serializer(
    "StandSummary",
    fields={
        "pipeline": serializers.CharField(),
        "id": serializers.UUIDField(),
        "holdings": serializers.IntegerField(),
        "records": serializers.IntegerField(),
    },
)


def _holding(request: Request, pipeline: str, data: dict[str, Any]) -> Record:
    stand = services.stand_get(services.definition_get(pipeline).name)
    record = record_selectors.record_get(user=request.user, record_id=data["record"])
    if record.parent_id != stand.pk or record.phase == Phase.DELETED:
        raise ValidationFailed(
            f"record {record.pk} is not held by the stand of {pipeline!r}",
            fields={"record": ["not a holding of this stand"]},
        )
    return record


class StandViewSet(viewsets.ViewSet):
    """Each pipeline's stand: the subtrees runs handed over, each with its own TTL."""

    lookup_field = "pipeline"
    lookup_value_regex = r"[A-Za-z0-9_.-]+"

    @extend_schema(responses=StandSummary)
    def list(self, request: Request) -> Response:
        stands = list(
            Record.objects.filter(kind="graphene.stand", parent__isnull=True)
            .exclude(phase=Phase.DELETED)
            .order_by("name")
        )
        known = {p.name for p in selectors.pipeline_list()}
        live = Record.objects.filter(tree_id__in=[s.tree_id for s in stands]).exclude(phase=Phase.DELETED)
        sizes = dict(live.values_list("tree_id").annotate(n=Count("pk")))
        holdings = dict(live.filter(level=1).values_list("tree_id").annotate(n=Count("pk")))
        return Response(
            [
                {
                    "pipeline": s.name,
                    "id": str(s.pk),
                    "holdings": holdings.get(s.tree_id, 0),
                    "records": sizes.get(s.tree_id, 1) - 1,
                }
                for s in stands
                if s.name in known
            ]
        )

    @extend_schema(operation_id="v1_stands_retrieve", responses=RecordOutput(many=True))
    def retrieve(self, request: Request, pipeline: str) -> Response:
        stand = services.stand_get(services.definition_get(pipeline).name)
        held = list(Record.objects.filter(parent=stand).exclude(phase=Phase.DELETED).order_by("created_at"))
        items = []
        for record in held:
            item = dict(RecordOutput(record).data)
            item["subtree_records"] = record.get_descendant_count() + 1
            items.append(item)
        return Response({"pipeline": pipeline, "id": str(stand.pk), "holdings": items})

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
