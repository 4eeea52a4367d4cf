"""Git sources over REST: where a namespace's pipeline code comes from (a repository at a ref),
and ``sync``, which turns the commit the ref names now into a revision."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from graphene_sdk.validation import DNS_LABEL
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.pagination import ByName
from apps.api.params import DoorChecks
from apps.api.permissions import request_namespace, target_namespace
from apps.pipelines.api.serializers import SourceApplyInput, SourceChangeInput, SourceOutput, SourceSyncOutput
from apps.pipelines.delivery import sources
from apps.pipelines.models import Source

NAME_PATTERN = f"^{DNS_LABEL.pattern}$"
NAMESPACE = OpenApiParameter(
    "namespace", {"type": "string", "pattern": NAME_PATTERN}, description="the source's namespace (default: default)"
)
# As every list's: a name no namespace has lists nothing.
LIST_NAMESPACE = OpenApiParameter(
    "namespace", str, description="the sources of this namespace (default: every namespace the caller may read)"
)
SETTINGS = ("url", "ref", "subdirectory", "credential", "activate")


class SourceViewSet(DoorChecks, viewsets.GenericViewSet[Source]):
    """Git sources of pipeline code. A sync asks the repository what its ref names now and makes
    a revision of a new commit (activated unless the source says otherwise); a sync that fails
    records why on the source and leaves the active revisions as they are."""

    serializer_class = SourceOutput
    pagination_class = ByName
    queryset = Source.objects.none()
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    path_patterns = {"name": NAME_PATTERN}

    access_resource = "sources"
    access_verbs = {
        "list": "list",
        "retrieve": "get",
        "create": "create",
        "update": "update",
        "partial_update": "update",
        "destroy": "delete",
        "sync": "update",
    }

    @extend_schema(parameters=[LIST_NAMESPACE], responses=SourceOutput(many=True))
    def list(self, request: Request) -> Response:
        qs = sources.source_list(user=request.user, namespace=request_namespace(request))
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(SourceOutput(page, many=True).data)

    @extend_schema(parameters=[NAMESPACE], responses=SourceOutput)
    def retrieve(self, request: Request, name: str) -> Response:
        source = sources.source_get(user=request.user, name=name, namespace=target_namespace(request))
        return Response(SourceOutput(source).data)

    @extend_schema(parameters=[NAMESPACE], request=SourceApplyInput, responses={201: SourceOutput, 200: SourceOutput})
    def create(self, request: Request) -> Response:
        """Create a source, or change the one of that name to these settings (200). Nothing is
        fetched: ``sync`` does that."""
        data = SourceApplyInput(data=request.data)
        data.is_valid(raise_exception=True)
        return self._apply(request, dict(data.validated_data))

    @extend_schema(parameters=[NAMESPACE], request=SourceChangeInput, responses={200: SourceOutput, 201: SourceOutput})
    def update(self, request: Request, name: str) -> Response:
        """Set every setting of the source (created if there is none: 201); those left out take
        their defaults."""
        data = SourceChangeInput(data=request.data)
        data.is_valid(raise_exception=True)
        return self._apply(request, {**data.validated_data, "name": name})

    @extend_schema(parameters=[NAMESPACE], request=SourceChangeInput, responses={200: SourceOutput})
    def partial_update(self, request: Request, name: str) -> Response:
        """Change the settings given; the others stay as they are."""
        data = SourceChangeInput(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        source = sources.source_get(user=request.user, name=name, namespace=target_namespace(request))
        current = {key: getattr(source, key) for key in SETTINGS}
        return self._apply(request, {**current, **data.validated_data, "name": name})

    def _apply(self, request: Request, settings: dict[str, Any]) -> Response:
        applied = sources.source_apply(namespace=target_namespace(request), actor=request.user, **settings)
        code = status.HTTP_201_CREATED if applied.created else status.HTTP_200_OK
        return Response(SourceOutput(applied.source).data, status=code)

    @extend_schema(parameters=[NAMESPACE], request=None, responses={204: None})
    def destroy(self, request: Request, name: str) -> Response:
        """Delete the source; its revisions stay, and the pipelines keep their active ones."""
        source = sources.source_get(user=request.user, name=name, namespace=target_namespace(request))
        sources.source_delete(source=source, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(parameters=[NAMESPACE], request=None, responses={200: SourceSyncOutput})
    @action(detail=True, methods=["post"])
    def sync(self, request: Request, name: str) -> Response:
        """Make a revision of the commit the source's ref names now, activating its pipelines
        unless the source says otherwise. The same commit as last time: nothing is exported
        (``new`` false). A failure (repository unreachable, no such ref, credential refused,
        code that does not import or defines no pipeline) is a 400 naming the cause; it is
        recorded on the source (``error``), and the active revisions stay as they are."""
        source = sources.source_get(user=request.user, name=name, namespace=target_namespace(request))
        synced = sources.source_sync(source=source, actor=request.user)
        context = {"new": synced.new, "created": synced.created, "activated": synced.activated}
        return Response(SourceSyncOutput(synced.source, context=context).data)
