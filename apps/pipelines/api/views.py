"""Pipelines and runs over REST: thin views over selectors and services."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api import schema as api_schema
from apps.api.pagination import ByName, NewestFirst, OldestFirstById
from apps.api.params import DoorChecks, uuid_param
from apps.api.permissions import request_namespace
from apps.pipelines import selectors, services
from apps.pipelines.api.serializers import (
    ActivateInput,
    PipelineEventOutput,
    PipelineOutput,
    PlanInput,
    PlanOutput,
    RunDetailOutput,
    RunEventOutput,
    RunOutput,
    RunStartInput,
)
from apps.pipelines.choices import RunStatus
from apps.pipelines.delivery import revisions
from apps.pipelines.models import Pipeline, Run
from apps.pipelines.services.plan import pipeline_plan

JOURNAL_LIMIT = 1000
IDEMPOTENCY_HEADER = "Idempotency-Key"


def _run_detail(run: Run) -> dict[str, Any]:
    journal = selectors.run_journal(run=run, limit=JOURNAL_LIMIT + 1)
    context = {"journal": journal[:JOURNAL_LIMIT], "journal_truncated": len(journal) > JOURNAL_LIMIT}
    return dict(RunDetailOutput(run, context=context).data)


class PipelineViewSet(DoorChecks, viewsets.GenericViewSet):
    """Loaded pipelines with their input and output JSON Schemas; start runs."""

    serializer_class = PipelineOutput
    pagination_class = ByName
    access_resource = "pipelines"
    access_verbs = {
        "list": "list",
        "retrieve": "get",
        "start": ("start", "runs"),
        "activate": "update",
        "events": "get",
        # A plan does nothing and writes nothing: who may see the pipeline may see its plan.
        "plan": "get",
    }
    queryset = Pipeline.objects.none()
    lookup_field = "name"
    lookup_value_regex = r"[A-Za-z0-9_.-]+"

    @extend_schema(responses=PipelineOutput(many=True))
    def list(self, request: Request) -> Response:
        """Every loaded pipeline, in name order, paged like every list."""
        services.pipelines_sync_all()
        qs = selectors.pipeline_list(user=request.user).select_related("revision")
        if namespace := request_namespace(request):
            qs = qs.filter(namespace=namespace)
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(PipelineOutput(page, many=True).data)

    @extend_schema(responses=PipelineOutput)
    def retrieve(self, request: Request, name: str) -> Response:
        return Response(PipelineOutput(services.pipeline_sync(services.definition_get(name, user=request.user))).data)

    @extend_schema(
        request=RunStartInput,
        parameters=[
            OpenApiParameter(
                IDEMPOTENCY_HEADER,
                str,
                OpenApiParameter.HEADER,
                description="a key of the client's (a UUID, a CI build id): the same start again returns the "
                "run it started (`Idempotent-Replayed: true`), for as long as the run exists; the same key "
                "with other inputs is a 422",
            )
        ],
        responses={201: RunOutput, 422: None},
    )
    @action(detail=True, methods=["post"], url_path="runs")
    def start(self, request: Request, name: str) -> Response:
        """Start a run; ``inputs`` are validated against the pipeline's schema (400 per field).
        Safe to retry with an ``Idempotency-Key``: a start that happened is answered again."""
        data = RunStartInput(data=request.data)
        data.is_valid(raise_exception=True)
        key = request.headers.get(IDEMPOTENCY_HEADER)
        draft = data.validated_data.get("revision")
        run = services.run_start(
            pipeline_name=name,
            inputs=data.validated_data["inputs"],
            actor=request.user,
            idempotency_key=key,
            revision=revisions.revision_find(user=request.user, ref=draft) if draft else None,
        )
        # The answer is built from the committed run alone: nothing after the commit can fail it.
        headers = {"Idempotent-Replayed": "true"} if getattr(run, "replayed", False) else {}
        return Response(RunOutput(run).data, status=status.HTTP_201_CREATED, headers=headers)

    @extend_schema(request=PlanInput, responses={200: PlanOutput, 422: None})
    @action(detail=True, methods=["post"])
    def plan(self, request: Request, name: str) -> Response:
        """What a run with these inputs would do, without doing it: its declarations (kinds, names,
        owners), steps, child runs and agent calls in order, with placeholders where it would read
        a value from outside, and the tree of its records. Inputs are checked as a start checks
        them (400 per field); code that raises or takes too long is a 422. Nothing is written."""
        data = PlanInput(data=request.data)
        data.is_valid(raise_exception=True)
        draft = data.validated_data.get("revision")
        answer = pipeline_plan(
            name=name,
            inputs=data.validated_data["inputs"],
            actor=request.user,
            revision=revisions.revision_find(user=request.user, ref=draft) if draft else None,
        )
        return Response(PlanOutput(answer).data)

    @extend_schema(request=ActivateInput, responses=PipelineOutput)
    @action(detail=True, methods=["post"])
    def activate(self, request: Request, name: str) -> Response:
        """Make a revision the pipeline's active one: new runs start on it; runs started before
        keep theirs. Activating an older revision is a rollback."""
        data = ActivateInput(data=request.data)
        data.is_valid(raise_exception=True)
        revision = revisions.revision_find(user=request.user, ref=data.validated_data["revision"])
        revisions.pipeline_activate(name=name, revision=revision, actor=request.user)
        row = Pipeline.objects.select_related("revision").get(name=name)
        return Response(PipelineOutput(row).data)

    @extend_schema(responses=PipelineEventOutput(many=True))
    @action(detail=True, methods=["get"], pagination_class=OldestFirstById)
    def events(self, request: Request, name: str) -> Response:
        """The pipeline's delivery history, oldest first: each activation and rollback, by whom."""
        row = services.pipeline_sync(services.definition_get(name, user=request.user))
        page = self.paginate_queryset(row.events.select_related("actor").order_by("id"))
        return self.get_paginated_response(PipelineEventOutput(page, many=True).data)


class RunViewSet(DoorChecks, viewsets.GenericViewSet):
    """Runs: list, get (with journal), status history, cancel, resume."""

    path_ids = {"pk": "run"}
    serializer_class = RunOutput
    pagination_class = NewestFirst
    access_resource = "runs"
    access_verbs = {"list": "list", "retrieve": "get", "events": "get", "cancel": "cancel", "resume": "resume"}
    queryset = Run.objects.none()

    @extend_schema(
        parameters=[
            OpenApiParameter("pipeline", str, description="runs of this pipeline (its name)"),
            api_schema.enum_list_param("status", [*RunStatus.values], "comma-separated statuses"),
            api_schema.uuid_param("parent", "the child runs of this run (a run id)"),
        ],
        responses=RunOutput(many=True),
    )
    def list(self, request: Request) -> Response:
        statuses = [s for s in request.query_params.get("status", "").split(",") if s]
        qs = selectors.run_list(
            user=request.user,
            pipeline=request.query_params.get("pipeline"),
            statuses=statuses,
            parent=uuid_param(request.query_params, "parent", noun="run"),
            namespace=request_namespace(request),
        ).select_related("pipeline", "parent_run__pipeline", "revision")
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(RunOutput(page, many=True).data)

    @extend_schema(responses=RunDetailOutput)
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(_run_detail(selectors.run_get(user=request.user, run_id=pk)))

    @extend_schema(responses=RunEventOutput(many=True))
    @action(detail=True, methods=["get"], pagination_class=OldestFirstById)
    def events(self, request: Request, pk: str) -> Response:
        """The run's status history, oldest first: every move, why, and who made it."""
        run = selectors.run_get(user=request.user, run_id=pk)
        page = self.paginate_queryset(selectors.run_events(run=run))
        return self.get_paginated_response(RunEventOutput(page, many=True).data)

    @extend_schema(request=None, responses=RunOutput)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        """Cancel the run: it ends now and everything it owns is deleted, children first."""
        run = services.run_cancel(run=selectors.run_get(user=request.user, run_id=pk), actor=request.user)
        return Response(RunOutput(run).data)

    @extend_schema(request=None, responses=RunOutput)
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str) -> Response:
        """Run it again by replay: nothing journaled is redone."""
        run = services.run_resume(run=selectors.run_get(user=request.user, run_id=pk), actor=request.user)
        return Response(RunOutput(run).data)
