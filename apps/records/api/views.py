"""Records over REST: thin views — input serializer, selector, one service call, output."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.pagination import Cursor
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api import schema as api_schema
from apps.api.pagination import NewestFirst, OldestFirstById
from apps.api.params import (
    MAX_LINE_ID,
    MAX_TAIL,
    DoorChecks,
    bool_param,
    datetime_param,
    int_param,
    log_filter_params,
    log_start_params,
    uuid_param,
)
from apps.api.permissions import request_namespace
from apps.core import access, validation
from apps.core.db import release_pooled_connection
from apps.core.errors import NotFound, ValidationFailed
from apps.observability.selectors import LOG_FIELDS, log_batches, log_output, log_rows, log_start
from apps.observability.services import SEVERITIES, log_dropped
from apps.records import selectors, services
from apps.records.api.serializers import (
    EventOutput,
    ExtendInput,
    KindOutput,
    LogPage,
    RecordApplyInput,
    RecordDetailOutput,
    RecordOutput,
    SweepOutput,
    TransferInput,
    TreeNode,
)
from apps.records.choices import ROOT_KINDS, EventType, Phase
from apps.records.models import Record
from kinds import UnknownKind, get_kind, registry

MAX_WAIT_SECONDS = 300
MAX_TREE_DEPTH = 10


class EventStreamRenderer(BaseRenderer):
    """Lets ``Accept: text/event-stream`` through content negotiation; errors render as JSON."""

    media_type = "text/event-stream"
    format = "event-stream"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return json.dumps(data).encode()


LOG_STREAM_KEEPALIVE_SECONDS = 15.0


async def _log_events(rows: Any, after: int) -> AsyncIterator[str]:
    """Server-sent events of ``log_batches``, with a keep-alive comment when quiet."""
    yield "retry: 2000\n\n"
    quiet_since = time.monotonic()
    async for batch in log_batches(rows, after):
        if batch:  # one chunk per batch: each chunk is a trip through the ASGI server
            yield batch.events()
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= LOG_STREAM_KEEPALIVE_SECONDS:
            yield ": keep-alive\n\n"
            quiet_since = time.monotonic()


def _detail(record: Record) -> dict[str, Any]:
    context = {
        "owner_chain": selectors.record_owner_chain(record=record),
        "children": selectors.record_children_counts(record=record),
        "blocked_by": selectors.record_deletion_blockers(record=record),
    }
    return dict(RecordDetailOutput(record, context=context).data)


LOG_FILTER_PARAMS = [
    OpenApiParameter("grep", str, description="only lines containing this text (case-insensitive)"),
    OpenApiParameter("severity", str, enum=[*SEVERITIES], description="at least this severity"),
    api_schema.datetime_param("since"),
    api_schema.datetime_param("until"),
    api_schema.bool_param("descendants", "include the subtree's lines (default true)"),
]

LIST_PARAMS = [
    OpenApiParameter("kind", str, description="exact kind, e.g. file"),
    api_schema.enum_list_param("phase", [*Phase.values], "comma-separated phases"),
    api_schema.uuid_param("owner", "direct owner's id"),
    api_schema.label_param(),
    OpenApiParameter("name_prefix", str),
    api_schema.datetime_param("created_after"),
    api_schema.datetime_param("created_before"),
    api_schema.datetime_param("updated_after"),
    api_schema.datetime_param("updated_before"),
]


class RecordViewSet(DoorChecks, viewsets.GenericViewSet):
    """Records: list with selectors, get, tree, events, apply, delete, transfer, extend,
    release, protect, unprotect."""

    path_ids = {"pk": "record"}
    serializer_class = RecordOutput
    pagination_class = NewestFirst
    queryset = Record.objects.none()
    access_resource = "records"
    access_verbs = {
        "list": "list",
        "retrieve": "get",
        "create": "create",
        "destroy": "delete",
        "tree": "get",
        "events": "get",
        "logs": "get",
        "logs_stream": "watch",
        "transfer": "update",
        "extend": "update",
        "release": "update",
        "protect": "update",
        "unprotect": "update",
    }

    @extend_schema(parameters=LIST_PARAMS, responses=RecordOutput(many=True))
    def list(self, request: Request) -> Response:
        params = request.query_params
        phases = [p for p in params.get("phase", "").split(",") if p]
        owner = uuid_param(params, "owner")
        if owner is not None:
            owner = str(selectors.record_get(user=request.user, record_id=owner).pk)
        qs = selectors.record_list(
            user=request.user,
            kind=params.get("kind"),
            phases=phases,
            owner=owner,
            labels=selectors.parse_label_selector(params.getlist("label")),
            name_prefix=params.get("name_prefix"),
            created_after=datetime_param(request.query_params, "created_after"),
            created_before=datetime_param(request.query_params, "created_before"),
            updated_after=datetime_param(request.query_params, "updated_after"),
            updated_before=datetime_param(request.query_params, "updated_before"),
            namespace=request_namespace(request),
        )
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(RecordOutput(page, many=True).data)

    @extend_schema(responses=RecordDetailOutput)
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(_detail(selectors.record_get(user=request.user, record_id=pk)))

    @extend_schema(request=RecordApplyInput, responses={201: RecordDetailOutput, 200: RecordDetailOutput})
    def create(self, request: Request) -> Response:
        """Apply: declare a record of a kind with a spec under an owner (or create a stand root)."""
        data = RecordApplyInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        expires_at = v.get("expires_at")
        if v.get("ttl_seconds"):
            expires_at = timezone.now() + timedelta(seconds=v["ttl_seconds"])
        if v["kind"] in ROOT_KINDS:
            if v["kind"] != "graphene.stand" or v.get("owner"):
                raise ValidationFailed(
                    f"{v['kind']} records are roots created by Graphene itself; only graphene.stand roots "
                    "can be created here, and they take no owner",
                    fields={"kind": ["not creatable here"] if v["kind"] != "graphene.stand" else []}
                    | ({"owner": ["a stand has no owner"]} if v.get("owner") else {}),
                )
            access.require(request.user, "create", "stands", v["namespace"])
            access.namespace_check(v["namespace"])
            record = services.record_create_root(
                kind=v["kind"],
                name=v["name"],
                spec=v["spec"],
                labels=v["labels"],
                namespace=v["namespace"],
                actor=request.user,
            )
            return Response(_detail(record), status=status.HTTP_201_CREATED)
        if not v.get("owner"):
            raise ValidationFailed(
                "owner is required: every record has exactly one owner (a run, a stand or another record)",
                fields={"owner": ["this field is required"]},
            )
        owner = selectors.record_get(user=request.user, record_id=validation.parse_uuid(v["owner"], field="owner"))
        access.require(request.user, "create", "records", owner.namespace)
        before = (
            Record.objects.filter(parent=owner, kind=v["kind"], name=v["name"]).exclude(phase=Phase.DELETED).first()
        )
        record = services.record_declare(
            kind=v["kind"],
            name=v["name"],
            owner=owner,
            spec=v["spec"],
            labels=v["labels"],
            expires_at=expires_at,
            drift_policy=v["on_drift"],
            observe_every=v.get("reconcile_every_seconds"),
            actor=request.user,
        )
        created = before is None
        return Response(_detail(record), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(
        parameters=[
            api_schema.bool_param("wait", "wait until the whole subtree is deleted"),
            api_schema.int_param("timeout", 1, MAX_WAIT_SECONDS, "seconds to wait (default 60)"),
        ],
        responses={200: RecordDetailOutput, 202: RecordDetailOutput},
    )
    def destroy(self, request: Request, pk: str) -> Response:
        """Delete the record and its subtree, children first. 202 while in progress, 200 when gone.
        A deletion that stops at a protected record answers 202 at once, naming it in
        ``deletion_blocked_by``: waiting would not see it end."""
        record = selectors.record_get(user=request.user, record_id=pk)
        wait = bool_param(request.query_params, "wait")
        timeout = int_param(request.query_params, "timeout", 60, 1, MAX_WAIT_SECONDS)  # refused before acting
        record = services.record_delete_request(record=record, actor=request.user)
        if wait and not selectors.record_deletion_blockers(record=record, limit=1):
            deadline = time.monotonic() + timeout
            while record.phase != Phase.DELETED and time.monotonic() < deadline:
                release_pooled_connection()  # the web's pool is bounded: hold none while asleep
                time.sleep(0.1)
                record = Record.objects.get(pk=record.pk)
        code = status.HTTP_200_OK if record.phase == Phase.DELETED else status.HTTP_202_ACCEPTED
        return Response(_detail(record), status=code)

    @extend_schema(
        parameters=[api_schema.int_param("depth", 0, MAX_TREE_DEPTH, "levels below the record (default 3)")],
        responses=TreeNode,
    )
    @action(detail=True, methods=["get"])
    def tree(self, request: Request, pk: str) -> Response:
        record = selectors.record_get(user=request.user, record_id=pk)
        depth = int_param(request.query_params, "depth", 3, 0, MAX_TREE_DEPTH)
        nodes = selectors.record_subtree(record=record, depth=depth)
        owning = selectors.records_owning(n for n in nodes if n.level == record.level + depth)
        by_id: dict[Any, dict[str, Any]] = {}
        root: dict[str, Any] = {}
        for node in nodes:
            item: dict[str, Any] = {
                "id": str(node.pk),
                "kind": node.kind,
                "name": node.name,
                "phase": node.phase,
                "expires_at": node.expires_at.isoformat() if node.expires_at else None,
                "protected": node.protected,
                "children": [],
                "truncated": node.pk in owning,
            }
            by_id[node.pk] = item
            if node.pk == record.pk:
                root = item
            elif node.parent_id in by_id:
                by_id[node.parent_id]["children"].append(item)
        return Response(root)

    @extend_schema(responses=EventOutput(many=True))
    @action(detail=True, methods=["get"], pagination_class=OldestFirstById)
    def events(self, request: Request, pk: str) -> Response:
        record = selectors.record_get(user=request.user, record_id=pk)
        page = self.paginate_queryset(selectors.record_events(record=record))
        return self.get_paginated_response(EventOutput(page, many=True).data)

    @extend_schema(
        parameters=[
            *LOG_FILTER_PARAMS,
            api_schema.int_param(
                "tail", 1, MAX_TAIL, "only the last N lines, oldest first; `next` continues after them (follow)"
            ),
        ],
        responses=LogPage,
    )
    @action(detail=True, methods=["get"], pagination_class=OldestFirstById)
    def logs(self, request: Request, pk: str) -> Response:
        """The record's log lines (a run's include everything it declared), oldest first."""
        record = selectors.record_get(user=request.user, record_id=pk)
        lines, covered = log_rows(record=record, **log_filter_params(request.query_params))
        rows = lines.values(*LOG_FIELDS)
        if request.query_params.get("tail"):
            response = self._logs_tail(request, rows, int_param(request.query_params, "tail", 0, 1, MAX_TAIL))
        else:
            page = self.paginate_queryset(rows)
            response = self.get_paginated_response(log_output(page or []))
        # Never silent: how many lines the log bounds removed from what this view covers.
        response.data["dropped"] = log_dropped(covered)
        return response

    @extend_schema(
        parameters=[
            *LOG_FILTER_PARAMS,
            api_schema.int_param("after", 0, MAX_LINE_ID, "start after this line id (or the Last-Event-ID header)"),
            api_schema.int_param("tail", 1, MAX_TAIL, "start with the last N lines (default: from the first line)"),
        ],
        responses={(200, "text/event-stream"): str},
    )
    @action(detail=True, methods=["get"], url_path="logs/stream", renderer_classes=[EventStreamRenderer])
    def logs_stream(self, request: Request, pk: str) -> StreamingHttpResponse:
        """Follow the record's log live as server-sent events: one ``log`` event per line
        (``id`` = the line id, ``data`` = the line as JSON), a comment as keep-alive every
        15 s. Reconnecting clients resume after the ``Last-Event-ID`` they saw."""
        record = selectors.record_get(user=request.user, record_id=pk)
        rows, _covered = log_rows(record=record, **log_filter_params(request.query_params))
        after = log_start(rows, **log_start_params(request.query_params, request.headers.get("Last-Event-ID", "")))
        response = StreamingHttpResponse(_log_events(rows, after), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # proxies (nginx) must not hold events back
        return response

    def _logs_tail(self, request: Request, lines: Any, count: int) -> Response:
        """The last ``count`` lines, oldest first, and a cursor that continues after them."""
        newest = list(lines.order_by("-id")[:count])[::-1]
        query = request.query_params.copy()
        query.pop("tail", None)
        following = request.build_absolute_uri(f"{request.path}?{query.urlencode()}")
        if newest:  # else: nothing yet, follow from the first line
            paginator = OldestFirstById()
            paginator.base_url = following
            following = paginator.encode_cursor(Cursor(offset=0, reverse=False, position=newest[-1]["id"]))
        return Response({"next": following, "previous": None, "results": log_output(newest)})

    @extend_schema(request=TransferInput, responses=RecordDetailOutput)
    @action(detail=True, methods=["post"])
    def transfer(self, request: Request, pk: str) -> Response:
        """Give the record and its subtree to another owner, optionally with a new TTL."""
        record = selectors.record_get(user=request.user, record_id=pk)
        data = TransferInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        new_owner = selectors.record_get(user=request.user, record_id=v["to"])
        given_by = selectors.record_get(user=request.user, record_id=v["from"]) if v.get("from") else None
        ttl = v.get("ttl_seconds")
        record = services.record_transfer(
            record=record,
            new_owner=new_owner,
            given_by=given_by,
            expires_at=timezone.now() + timedelta(seconds=ttl) if ttl else None,
            actor=request.user,
        )
        return Response(_detail(record))

    @extend_schema(request=ExtendInput, responses=RecordDetailOutput)
    @action(detail=True, methods=["post"])
    def extend(self, request: Request, pk: str) -> Response:
        record = selectors.record_get(user=request.user, record_id=pk)
        data = ExtendInput(data=request.data)
        data.is_valid(raise_exception=True)
        by = timedelta(seconds=data.validated_data["by_seconds"])
        return Response(_detail(services.record_extend(record=record, by=by, actor=request.user)))

    @extend_schema(request=None, responses=RecordDetailOutput)
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk: str) -> Response:
        """Remove the record's TTL."""
        record = selectors.record_get(user=request.user, record_id=pk)
        return Response(_detail(services.record_release(record=record, actor=request.user)))

    @extend_schema(request=None, responses=RecordDetailOutput)
    @action(detail=True, methods=["post"])
    def protect(self, request: Request, pk: str) -> Response:
        """Protect the record: a deletion that reaches it (its own, an owner's, a TTL's, its
        run's end) stops there until it is unprotected. 409 for a record deleted or being deleted."""
        record = selectors.record_get(user=request.user, record_id=pk)
        return Response(_detail(services.record_protect(record=record, actor=request.user)))

    @extend_schema(request=None, responses=RecordDetailOutput)
    @action(detail=True, methods=["post"])
    def unprotect(self, request: Request, pk: str) -> Response:
        """Remove the protection; a deletion that waited on it goes on, children first."""
        record = selectors.record_get(user=request.user, record_id=pk)
        return Response(_detail(services.record_unprotect(record=record, actor=request.user)))


class KindViewSet(viewsets.ViewSet):
    """The kind dictionary: every installed kind with its spec JSON Schema."""

    lookup_value_regex = r"[^/]+"
    access_public = True  # the kind dictionary is code, the same for everyone signed in

    @staticmethod
    def _out(kind: Any) -> dict[str, Any]:
        return {
            "name": kind.name,
            "description": kind.description,
            "spec_schema": kind.spec_schema,
            "drift_interval_seconds": int(kind.drift_interval.total_seconds()) if kind.drift_interval else None,
        }

    @extend_schema(responses=KindOutput(many=True))
    def list(self, request: Request) -> Response:
        return Response([self._out(k) for _, k in sorted(registry().items())])

    @extend_schema(responses=KindOutput)
    def retrieve(self, request: Request, pk: str) -> Response:
        try:
            return Response(self._out(get_kind(pk)))
        except UnknownKind as exc:
            raise NotFound(str(exc)) from None


class OrphanViewSet(DoorChecks, viewsets.GenericViewSet):
    """What the orphan sweeper found: external objects whose record was gone."""

    pagination_class = OldestFirstById
    serializer_class = EventOutput
    queryset = Record.objects.none()
    # The sweeper works across every namespace: its findings and its runs need bindings in all.
    access_resource = "records"
    access_verbs = {"list": "list", "sweep": "delete"}

    @extend_schema(responses=EventOutput(many=True))
    def list(self, request: Request) -> Response:
        access.require(request.user, "list", "records", None)
        sweeper = services.record_ensure_root(kind="graphene.sweeper", name=services.SWEEPER_NAME)
        events = selectors.record_events(record=sweeper).filter(
            type__in=[EventType.ORPHAN_DELETED, EventType.ORPHAN_DELETE_FAILED]
        )
        page = self.paginate_queryset(events)
        return self.get_paginated_response(EventOutput(page, many=True).data)

    @extend_schema(
        request=None,
        parameters=[api_schema.bool_param("dry_run", "only list what would be deleted")],
        responses=SweepOutput,
    )
    @action(detail=False, methods=["post"])
    def sweep(self, request: Request) -> Response:
        """Run the sweeper now (it also runs every 10 minutes)."""
        access.require(request.user, "delete", "records", None)
        dry_run = bool_param(request.query_params, "dry_run")
        findings = services.records_sweep(dry_run=dry_run)
        return Response({"dry_run": dry_run, "found": len(findings), "orphans": findings})
