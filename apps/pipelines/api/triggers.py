"""Triggers over REST: what starts each pipeline's runs besides people (declared in the
pipeline's code), their history, and pausing and resuming them."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.pagination import ByName, OldestFirstById
from apps.api.params import DoorChecks
from apps.api.permissions import request_namespace
from apps.pipelines import selectors
from apps.pipelines.api.serializers import TriggerEventOutput, TriggerOutput
from apps.pipelines.choices import TriggerType
from apps.pipelines.models import Trigger
from apps.pipelines.services import triggers

FILTERS = [
    OpenApiParameter("namespace", str, description="the triggers of this namespace's pipelines"),
    OpenApiParameter("pipeline", str, description="the triggers of this pipeline"),
    OpenApiParameter("name", str, description="the trigger of this name"),
    OpenApiParameter("type", str, enum=TriggerType.values, description="upstream, cron or webhook"),
]


class TriggerViewSet(DoorChecks, viewsets.GenericViewSet):
    """Triggers are declared in pipelines' code and made when it is activated; people read,
    pause and resume them. Reading them takes reading pipelines; pausing takes updating them."""

    serializer_class = TriggerOutput
    pagination_class = ByName
    queryset = Trigger.objects.none()
    access_resource = "pipelines"
    access_verbs = {"list": "list", "retrieve": "get", "events": "get", "pause": "update", "resume": "update"}

    @extend_schema(parameters=FILTERS, responses=TriggerOutput(many=True))
    def list(self, request: Request) -> Response:
        kind = request.query_params.get("type")
        qs = selectors.trigger_list(
            user=request.user,
            namespace=request_namespace(request),
            pipeline=request.query_params.get("pipeline") or None,
            name=request.query_params.get("name") or None,
            type=kind or None,
        )
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(TriggerOutput(page, many=True).data)

    @extend_schema(responses=TriggerOutput)
    def retrieve(self, request: Request, pk: str) -> Response:
        trigger = selectors.trigger_get(user=request.user, trigger_id=pk)
        return Response(TriggerOutput(trigger).data)

    @extend_schema(responses=TriggerEventOutput(many=True))
    @action(detail=True, methods=["get"], pagination_class=OldestFirstById)
    def events(self, request: Request, pk: str) -> Response:
        """The trigger's history, oldest first: each firing and what it started, each cause it
        skipped (paused, missed instants), each delivery it refused, each pause and resume."""
        trigger = selectors.trigger_get(user=request.user, trigger_id=pk)
        page = self.paginate_queryset(trigger.events.select_related("actor").order_by("id"))
        return self.get_paginated_response(TriggerEventOutput(page, many=True).data)

    @extend_schema(request=None, responses=TriggerOutput)
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str) -> Response:
        """Pause: the trigger starts nothing, and records each cause it skips. 409 if paused already."""
        trigger = selectors.trigger_get(user=request.user, trigger_id=pk)
        return Response(TriggerOutput(triggers.trigger_pause(trigger=trigger, paused=True, actor=request.user)).data)

    @extend_schema(request=None, responses=TriggerOutput)
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str) -> Response:
        """Resume a paused trigger (a cron trigger fires from its next instant on). 409 if not paused."""
        trigger = selectors.trigger_get(user=request.user, trigger_id=pk)
        return Response(TriggerOutput(triggers.trigger_pause(trigger=trigger, paused=False, actor=request.user)).data)
