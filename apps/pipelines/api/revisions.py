"""Revisions over REST: push a directory's archive (``graphenectl pipeline push``), list and
read the immutable revisions of pipeline code."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api import schema as api_schema
from apps.api.pagination import NewestFirst
from apps.api.params import DoorChecks, bool_param
from apps.api.parsers import MultiPartParser
from apps.api.permissions import request_namespace, target_namespace
from apps.pipelines.api.serializers import PushOutput, RevisionOutput
from apps.pipelines.delivery import revisions
from apps.pipelines.models import Revision


class RevisionViewSet(DoorChecks, viewsets.GenericViewSet):
    """Immutable revisions of pipeline code: what each defines, where it came from, by whom."""

    serializer_class = RevisionOutput
    pagination_class = NewestFirst
    access_resource = "revisions"
    access_verbs = {"list": "list", "retrieve": "get", "create": "create"}
    queryset = Revision.objects.none()
    parser_classes = [MultiPartParser]  # the archive is read from the body by ``create`` itself
    lookup_value_regex = r"[A-Za-z0-9:-]+"

    @extend_schema(
        parameters=[OpenApiParameter("pipeline", str, description="revisions that define this pipeline")],
        responses=RevisionOutput(many=True),
    )
    def list(self, request: Request) -> Response:
        qs = revisions.revision_list(
            user=request.user, namespace=request_namespace(request), pipeline=request.query_params.get("pipeline")
        )
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(RevisionOutput(page, many=True).data)

    @extend_schema(responses=RevisionOutput)
    def retrieve(self, request: Request, pk: str) -> Response:
        """A revision by id or by at least 7 digits of its digest."""
        revision = revisions.revision_find(user=request.user, ref=pk, namespace=request_namespace(request))
        return Response(RevisionOutput(revision).data)

    @extend_schema(
        parameters=[
            api_schema.bool_param("activate", "make its pipelines active (default true); false: a draft"),
        ],
        request={"application/octet-stream": bytes},
        responses={201: PushOutput, 200: PushOutput, 400: None},
    )
    def create(self, request: Request) -> Response:
        """Push a directory as a tar archive (gzipped or not; any content type) in the body: it becomes a revision
        of the namespace (``?namespace=``, default ``default``) once its code imports in a fresh
        process and defines pipelines; the same files again are the same revision (200)."""
        activate = bool_param(request.query_params, "activate", default=True)
        pushed = revisions.revision_push(
            chunks=iter(lambda: request._request.read(1024 * 1024), b""),
            namespace=target_namespace(request),
            actor=request.user,
            activate=activate,
        )
        context = {"created": pushed.created, "activated": pushed.activated}
        code = status.HTTP_201_CREATED if pushed.created else status.HTTP_200_OK
        return Response(PushOutput(pushed.revision, context=context).data, status=code)
