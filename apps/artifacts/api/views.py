"""Artifacts over REST: list, metadata, streaming download and upload.

Upload (``POST /api/v1/artifacts/?name=...&owner=<record id>``) takes either the raw bytes as
the request body or a ``multipart/form-data`` body with one file field ``file`` (the other
options may then come as form fields too). The bytes are streamed to the blob store, never
held in memory; a failed upload leaves neither a blob nor a record.

Download (``GET /api/v1/artifacts/<id>/content/``) streams the blob with ``Content-Length``,
``ETag`` (its sha256: the content never changes) and ``Content-Disposition``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from pathlib import PurePosixPath
from typing import IO, Any

from django.http import HttpResponse, StreamingHttpResponse
from django.utils import timezone
from django.utils.http import content_disposition_header
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api import schema as api_schema
from apps.api.pagination import NewestFirst
from apps.api.params import MAX_SECONDS, DoorChecks, bool_param, int_param, uuid_param
from apps.api.parsers import MultiPartParser
from apps.api.permissions import request_namespace
from apps.artifacts import blobs, selectors, services
from apps.artifacts.api.serializers import ArtifactOutput
from apps.core import access, validation
from apps.core.errors import ValidationFailed
from apps.pipelines import selectors as run_selectors
from apps.records import selectors as record_selectors
from apps.records.choices import Phase
from apps.records.models import Record

# Content types of a raw body that describe the transport, not the artifact.
_GENERIC_TYPES = {"", "application/octet-stream", "application/x-www-form-urlencoded"}


class AnyRenderer(BaseRenderer):
    """Lets any ``Accept`` through content negotiation for downloads; errors render as JSON."""

    media_type = "*/*"
    format = "bin"
    charset = None

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return JSONRenderer().render(data)


async def _chunks(blob: IO[bytes]) -> AsyncIterator[bytes]:
    """The blob a chunk at a time (the ASGI server sends each before the next is read)."""
    try:
        while True:
            chunk = await asyncio.to_thread(blob.read, blobs.CHUNK)
            if not chunk:
                return
            yield chunk
    finally:
        blob.close()


LIST_PARAMS = [
    OpenApiParameter("name", str, description="artifacts of this name (exact)"),
    OpenApiParameter("pipeline", str, description="held by the pipeline's stand or published by its runs"),
    api_schema.uuid_param("run", "published by this run (its id)"),
    api_schema.label_param(),
    api_schema.bool_param("include_deleted", "also deleted ones (tombstones)"),
]

UPLOAD_PARAMS = [
    OpenApiParameter("name", str, required=True, description="the artifact's name, e.g. dist/app.tar.gz"),
    OpenApiParameter(
        "owner", OpenApiTypes.UUID, required=True, description="the owning record's id (a stand's, or any record's)"
    ),
    OpenApiParameter("content_type", str, description="media type (default: the body's, else guessed from name)"),
    OpenApiParameter(
        "sha256",
        {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        description="the expected digest (hex): the upload is refused if the bytes differ",
    ),
    api_schema.int_param("ttl_seconds", 1, MAX_SECONDS, "delete it after this many seconds"),
    api_schema.label_param("k=v (repeatable)"),
]


def _options(request: Request, is_multipart: bool) -> Mapping[str, Any]:
    """Query parameters, and for multipart bodies the form fields too (the query wins)."""
    merged: dict[str, Any] = {}
    if is_multipart:
        form: Any = request.data  # a QueryDict for multipart bodies
        for key in form:
            if key != "file":
                merged[key] = form.getlist(key)
    for key in request.query_params:
        merged[key] = request.query_params.getlist(key)
    return merged


def _one(options: Mapping[str, Any], key: str) -> str | None:
    values = options.get(key) or []
    if len(values) > 1:
        raise ValidationFailed(f"{key} is given {len(values)} times", fields={key: ["given more than once"]})
    return str(values[0]) if values else None


def _artifact(request: Request, pk: Any) -> Record:
    """The artifact, with the name of the pipeline whose run published it."""
    among = run_selectors.with_pipeline_name(selectors.artifacts_visible(user=request.user))
    return selectors.artifact_get(user=request.user, artifact_id=pk, among=among)


class ArtifactViewSet(DoorChecks, viewsets.GenericViewSet[Record]):
    """Artifacts: bytes in Graphene's blob store, each held by a record (owner, TTL, cascade)."""

    path_ids = {"pk": "artifact"}
    serializer_class = ArtifactOutput
    pagination_class = NewestFirst
    parser_classes = [MultiPartParser]  # a raw body is streamed by ``create`` itself
    queryset = Record.objects.none()
    access_resource = "artifacts"
    access_verbs = {"list": "list", "retrieve": "get", "create": "create", "content": "get"}

    @extend_schema(parameters=LIST_PARAMS, responses=ArtifactOutput(many=True))
    def list(self, request: Request) -> Response:
        params = request.query_params
        pipeline = params.get("pipeline")
        qs = selectors.artifact_list(
            user=request.user,
            name=params.get("name"),
            pipeline=pipeline,
            published_by=run_selectors.pipeline_run_ids(pipeline=pipeline) if pipeline else None,
            run=uuid_param(params, "run", noun="run"),
            labels=record_selectors.parse_label_selector(params.getlist("label")),
            include_deleted=bool_param(params, "include_deleted"),
        )
        if namespace := request_namespace(request):
            qs = qs.filter(namespace=namespace)
        page = self.paginate_queryset(run_selectors.with_pipeline_name(qs))
        return self.get_paginated_response(ArtifactOutput(page, many=True, context={"request": request}).data)

    @extend_schema(responses=ArtifactOutput)
    def retrieve(self, request: Request, pk: str) -> Response:
        record = _artifact(request, pk)
        return Response(ArtifactOutput(record, context={"request": request}).data)

    @extend_schema(
        parameters=UPLOAD_PARAMS,
        request={
            "application/octet-stream": bytes,
            "multipart/form-data": {
                "type": "object",
                "properties": {"file": {"type": "string", "format": "binary"}},
                "required": ["file"],
            },
        },
        responses={201: ArtifactOutput, 200: ArtifactOutput, 409: None, 413: None},
    )
    def create(self, request: Request) -> Response:
        """Upload an artifact (201); the same bytes under the same name and owner again: 200."""
        is_multipart = (request.content_type or "").startswith("multipart/form-data")
        options = _options(request, is_multipart)
        missing = [key for key in ("name", "owner") if not _one(options, key)]
        if missing:
            raise ValidationFailed(
                f"{' and '.join(missing)} required: POST /api/v1/artifacts/?name=NAME&owner=RECORD_ID "
                "with the bytes as the body (or multipart with a 'file' field)",
                fields={key: ["this field is required"] for key in missing},
            )
        owner_id = validation.parse_uuid(_one(options, "owner"), field="owner")
        owner = record_selectors.record_get(user=request.user, record_id=owner_id)
        access.require(request.user, "create", "artifacts", owner.namespace)
        ttl = int_param({"ttl_seconds": _one(options, "ttl_seconds") or ""}, "ttl_seconds", 0, 1, MAX_SECONDS)
        labels = record_selectors.parse_label_selector([str(v) for v in options.get("label") or []])
        length = request.META.get("CONTENT_LENGTH") or ""
        if not is_multipart and length.isdigit() and int(length) > blobs.max_bytes():
            raise blobs.TooLarge(
                f"the body has {length} bytes; the limit is {blobs.max_bytes()} (GRAPHENE_ARTIFACT_MAX_BYTES)"
            )
        content_type = _one(options, "content_type")
        if is_multipart:
            files = request.FILES.getlist("file")
            if len(files) != 1 or len(request.FILES) != 1:
                raise ValidationFailed(
                    "a multipart upload carries exactly one file, in the field 'file'", fields={"file": ["one file"]}
                )
            upload = files[0]
            if not content_type and (upload.content_type or "") not in _GENERIC_TYPES:
                content_type = upload.content_type
            chunks: Any = upload.chunks(blobs.CHUNK)
        else:
            if not content_type and (request.content_type or "").split(";")[0].strip() not in _GENERIC_TYPES:
                content_type = request.content_type
            body: Any = request._request  # Django's HttpRequest reads the body like a file
            chunks = blobs.chunks_of(body)
        record, created = services.artifact_upload(
            owner=owner,
            name=str(_one(options, "name")),
            chunks=chunks,
            content_type=content_type,
            expected_sha256=_one(options, "sha256"),
            labels=labels,
            expires_at=timezone.now() + timedelta(seconds=ttl) if ttl else None,
            actor=request.user,
        )
        record = _artifact(request, record.pk)
        return Response(
            ArtifactOutput(record, context={"request": request}).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    @extend_schema(
        responses={
            (200, "application/octet-stream"): OpenApiResponse(description="the bytes"),
            304: None,
            410: None,
        }
    )
    @action(detail=True, methods=["get"], url_path="content", renderer_classes=[JSONRenderer, AnyRenderer])
    def content(self, request: Request, pk: str) -> HttpResponse | StreamingHttpResponse:
        """Download the bytes (streamed; ``If-None-Match`` with the ETag answers 304)."""
        record = _artifact(request, pk)
        if record.phase == Phase.DELETED:
            raise services.ArtifactNotFound(f"artifact {record.spec.get('name')!r} ({record.pk}) has been deleted")
        sha256 = str(record.spec["sha256"])
        etag = f'"{sha256}"'
        if etag in [tag.strip() for tag in request.headers.get("If-None-Match", "").split(",")]:
            not_modified = HttpResponse(status=status.HTTP_304_NOT_MODIFIED)
            not_modified["ETag"] = etag
            return not_modified
        blob = blobs.open_blob(sha256)
        size = blobs.path_of(sha256).stat().st_size
        filename = PurePosixPath(str(record.spec.get("name") or "artifact")).name
        response = StreamingHttpResponse(
            _chunks(blob), content_type=record.spec.get("content_type") or services.DEFAULT_CONTENT_TYPE
        )
        response["Content-Length"] = str(size)
        response["ETag"] = etag
        response["X-Content-SHA256"] = sha256
        response["Content-Disposition"] = content_disposition_header(as_attachment=True, filename=filename) or ""
        response["Cache-Control"] = "private, max-age=86400, immutable"
        return response
