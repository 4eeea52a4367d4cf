"""Records over REST: thin views — input serializer, selector, one service call, output."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections
from django.db.models import BigIntegerField, Func, TextField
from django.db.models.functions import Cast
from django.http import StreamingHttpResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.pagination import Cursor
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.pagination import NewestFirst, OldestFirstById
from apps.core.errors import NotFound, ValidationFailed
from apps.observability.selectors import log_horizon, log_lines
from apps.observability.services import log_dropped
from apps.records import selectors, services
from apps.records.api.serializers import (
    EventOutput,
    ExtendInput,
    KindOutput,
    LogLineOutput,
    RecordApplyInput,
    RecordDetailOutput,
    RecordOutput,
    TransferInput,
    TreeNode,
)
from apps.records.choices import ROOT_KINDS, EventType, Phase
from apps.records.models import Record
from kinds import UnknownKind, get_kind, registry

MAX_WAIT_SECONDS = 300
MAX_TREE_DEPTH = 10


def datetime_param(params: Mapping[str, str], name: str) -> Any:
    """An ISO 8601 query parameter (naive means UTC), None if absent; a field error if malformed."""
    raw = params.get(name)
    if not raw:
        return None
    value = parse_datetime(raw)
    if value is None:
        raise ValidationFailed(f"{name}={raw!r} is not an ISO 8601 date-time", fields={name: ["not a date-time"]})
    if timezone.is_naive(value):
        value = timezone.make_aware(value, dt.UTC)
    return value


LOG_FIELDS = ("id", "record_id", "record__name", "at", "stream", "severity", "source", "message")
_AT = serializers.DateTimeField()


def _at_format() -> Any:
    """``DateTimeField().to_representation`` for the rows of one page: the current time zone
    looked up once, not per line (per line it was a third of a live log stream's CPU,
    bench/agent_logs.py); the same text (ISO 8601, ``Z`` for UTC)."""
    zone = timezone.get_current_timezone()

    def at(value: dt.datetime) -> str:
        if timezone.is_naive(value):
            return str(_AT.to_representation(value))
        text = value.astimezone(zone).isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text

    return at


def log_output(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``LogLineOutput``'s shape from ``values()`` rows: logs are read in pages of hundreds,
    and a ModelSerializer per line cost ten times the query (bench/logs_query.py)."""
    at = _at_format()
    return [
        {
            "id": row["id"],
            "record": str(row["record_id"]),
            "record_name": row["record__name"],
            "at": at(row["at"]),
            "stream": row["stream"],
            "severity": row["severity"],
            "source": row["source"],
            "message": row["message"],
        }
        for row in rows
    ]


class EventStreamRenderer(BaseRenderer):
    """Lets ``Accept: text/event-stream`` through content negotiation; errors render as JSON."""

    media_type = "text/event-stream"
    format = "event-stream"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return json.dumps(data).encode()


LOG_STREAM_POLL_SECONDS = 0.25
LOG_STREAM_KEEPALIVE_SECONDS = 15.0
# Lines per fetch of a live stream: a fast writer's backlog is read in few queries.
LOG_STREAM_BATCH = 5000


class _EpochMicros(Func):
    """A time as whole microseconds since 1970 (PostgreSQL). An integer is read in C, where a
    timestamp went through Django's time-zone loader in Python (a quarter of a live stream's
    CPU in the web process, bench/agent_logs.py) and ``to_char`` cost PostgreSQL 1.6 us a row.
    Exact: a float8 holds today's times to a fraction of a microsecond."""

    output_field = BigIntegerField()
    template = "round(date_part('epoch', %(expressions)s) * 1000000)::bigint"


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_json_text = json.encoder.encode_basestring_ascii  # json.dumps(str), in C


class LogBatch:
    """Lines of one fetch of a live stream (``log_batches``): rows as tuples, and what many lines
    share (the record's id and name, the time of a chunk, stream, source) turned into text once
    per batch. The text is the same as ``log_output`` and ``json.dumps`` of it give, for a
    fraction of the CPU (bench/agent_logs.py: the stream was half of the web process's work)."""

    def __init__(self, rows: list[tuple[Any, ...]], records: dict[str, tuple[str, str]], ats: dict[Any, str]) -> None:
        self.rows = rows
        self.records = records  # raw record id -> (its id as in the REST shape, its name)
        self.ats = ats  # time (microseconds on PostgreSQL, else a datetime) -> its text in the REST shape

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def last_id(self) -> int:
        return int(self.rows[-1][0])

    def lines(self) -> list[dict[str, Any]]:
        """The REST shape (``LogLineOutput``), one dict per line."""
        records, ats = self.records, self.ats
        return [
            {
                "id": line_id,
                "record": records[record][0],
                "record_name": records[record][1],
                "at": ats[at],
                "stream": stream,
                "severity": severity,
                "source": source,
                "message": message,
            }
            for line_id, record, at, stream, severity, source, message in self.rows
        ]

    def events(self) -> str:
        """Server-sent ``log`` events: byte for byte ``id: <id>\nevent: log\ndata: <json.dumps(line)>\n\n``."""
        quoted: dict[str, str] = {}  # the few distinct texts of a batch, each JSON-quoted once

        def q(text: str) -> str:
            value = quoted.get(text)
            if value is None:
                value = quoted[text] = _json_text(text)
            return value

        heads = {
            raw: f'"record": {q(record)}, "record_name": {q(name)}, "at": '
            for raw, (record, name) in self.records.items()
        }
        ats = {raw: q(text) for raw, text in self.ats.items()}
        return "".join(
            [
                f'id: {line_id}\nevent: log\ndata: {{"id": {line_id}, {heads[record]}{ats[at]}, "stream": {q(stream)}, '
                f'"severity": {q(severity)}, "source": {q(source)}, "message": {_json_text(message)}}}\n\n'
                for line_id, record, at, stream, severity, source, message in self.rows
            ]
        )


def log_fetch(rows: Any, after: int, limit: int = LOG_STREAM_BATCH) -> LogBatch:
    """Up to ``limit`` of ``rows`` (``log_rows``) after line ``after``, oldest first, up to the
    ``log_horizon`` (a line committed late with a lower id is not skipped: it is sent first).

    Two queries whose plans do not depend on the table's size or statistics. The first reads
    ids only, from the (record, id) index, to find the last line of the batch. The second
    reads the lines in that id range: it cannot run past the batch whichever index the planner
    picks (an ``id IN (subquery)`` was planned as a scan of the whole table once it held a few
    hundred thousand lines). Record ids come as text and times as integers; the batch's few
    distinct times are formatted once, and its records' names come in one more query instead
    of a join per line."""
    horizon = log_horizon()  # lines above it may still be joined by lower ids: not yet
    if horizon is not None:
        rows = rows.filter(id__lte=horizon)
    ahead = rows.filter(id__gt=after).order_by("id").values_list("id", flat=True)
    last = list(ahead[limit - 1 : limit])
    window = rows.filter(id__gt=after, **({"id__lte": last[0]} if last else {}))
    postgresql = connections[rows.db].vendor == "postgresql"
    columns = window.order_by("id").values_list(
        "id", Cast("record_id", TextField()), _EpochMicros("at") if postgresql else "at",
        "stream", "severity", "source", "message",
    )[:limit]  # fmt: skip
    if postgresql:  # psycopg's rows as they come: Django's iterator cost ~1 us a line more
        with connections[rows.db].cursor() as cursor:
            cursor.execute(*columns.query.sql_with_params())
            fetched = cursor.fetchall()
    else:
        fetched = list(columns)
    records: dict[str, tuple[str, str]] = {}
    ats: dict[Any, str] = {}
    if fetched:
        raw_ids = {row[1] for row in fetched}
        ids = {raw: str(uuid.UUID(raw)) for raw in raw_ids}  # SQLite keeps uuids without dashes
        names = dict(Record.objects.filter(pk__in=list(ids.values())).values_list("pk", "name"))
        records = {raw: (ids[raw], names.get(uuid.UUID(ids[raw]), "")) for raw in raw_ids}
        at = _at_format()
        if postgresql:
            ats = {value: at(_EPOCH + dt.timedelta(microseconds=value)) for value in {row[2] for row in fetched}}
        else:
            ats = {value: at(value) for value in {row[2] for row in fetched}}
    return LogBatch(fetched, records, ats)


async def log_batches(rows: Any, after: int) -> AsyncIterator[LogBatch]:
    """Lines stored after line ``after`` (``LogBatch``), polled by id (the (record, id) index)
    a few times a second, at once again while a backlog fills whole batches; an empty batch
    when a poll found nothing (for keep-alives). Serves the server-sent events and the
    websocket."""
    fetch = sync_to_async(log_fetch)
    while True:
        batch = await fetch(rows, after)
        if batch:
            after = batch.last_id
        yield batch
        if len(batch) < LOG_STREAM_BATCH:
            await asyncio.sleep(LOG_STREAM_POLL_SECONDS)


def log_start(rows: Any, params: Mapping[str, str], last_event_id: str = "") -> int:
    """Where a live follow starts: after ``Last-Event-ID``, ``after``, or before the last ``tail``
    lines (default: from the first line)."""
    after = int_param(params, "after", 0, 0, 2**62)
    if last_event_id.isdigit():
        return max(after, int(last_event_id))
    if params.get("tail"):
        newest = list(rows.order_by("-id").values_list("id", flat=True)[: int_param(params, "tail", 0, 1, 10_000)])
        return newest[-1] - 1 if newest else 0
    return after


def log_rows(user: Any, record_id: Any, params: Mapping[str, str]) -> tuple[Any, Any]:
    """A record's filtered log lines (a ``LogLine`` queryset) and the ids of the records they cover."""
    record = selectors.record_get(user=user, record_id=record_id)
    descendants = params.get("descendants", "true").lower() not in {"0", "false", "no"}
    covered: Any = selectors.subtree_of(record).values_list("pk", flat=True) if descendants else [record.pk]
    lines = log_lines(
        record=record,
        include_descendants=descendants,
        grep=params.get("grep"),
        min_severity=params.get("severity"),
        since=datetime_param(params, "since"),
        until=datetime_param(params, "until"),
    )
    return lines, covered


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


def int_param(params: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    """An integer query parameter within [lo, hi], ``default`` if absent; a field error otherwise."""
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationFailed(f"{name}={raw!r} is not an integer", fields={name: ["not an integer"]}) from None
    if not lo <= value <= hi:
        raise ValidationFailed(f"{name} must be between {lo} and {hi}", fields={name: [f"between {lo} and {hi}"]})
    return value


def _detail(record: Record) -> dict[str, Any]:
    context = {
        "owner_chain": selectors.record_owner_chain(record=record),
        "children": selectors.record_children_counts(record=record),
    }
    return dict(RecordDetailOutput(record, context=context).data)


LOG_FILTER_PARAMS = [
    OpenApiParameter("grep", str, description="only lines containing this text (case-insensitive)"),
    OpenApiParameter("severity", str, description="at least this severity: debug, info, warning, error"),
    OpenApiParameter("since", str, description="ISO 8601 date-time"),
    OpenApiParameter("until", str, description="ISO 8601 date-time"),
    OpenApiParameter("descendants", bool, description="include the subtree's lines (default true)"),
]

LIST_PARAMS = [
    OpenApiParameter("kind", str, description="exact kind, e.g. file"),
    OpenApiParameter("phase", str, description="comma-separated phases"),
    OpenApiParameter("owner", str, description="direct owner's id"),
    OpenApiParameter("label", str, many=True, description="k=v (repeatable; all must match)"),
    OpenApiParameter("name_prefix", str),
    OpenApiParameter("created_after", str),
    OpenApiParameter("created_before", str),
    OpenApiParameter("updated_after", str),
    OpenApiParameter("updated_before", str),
]


class RecordViewSet(viewsets.GenericViewSet):
    """Records: list with selectors, get, tree, events, apply, delete, transfer, extend."""

    serializer_class = RecordOutput
    pagination_class = NewestFirst
    queryset = Record.objects.none()

    @extend_schema(parameters=LIST_PARAMS, responses=RecordOutput(many=True))
    def list(self, request: Request) -> Response:
        params = request.query_params
        phases = [p for p in params.get("phase", "").split(",") if p]
        owner = params.get("owner")
        if owner:
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
        owner = selectors.record_get(user=request.user, record_id=v["owner"])
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
            OpenApiParameter("wait", bool, description="wait until the whole subtree is deleted"),
            OpenApiParameter("timeout", int, description="seconds to wait (default 60, at most 300)"),
        ],
        responses={200: RecordDetailOutput, 202: RecordDetailOutput},
    )
    def destroy(self, request: Request, pk: str) -> Response:
        """Delete the record and its subtree, children first. 202 while in progress, 200 when gone."""
        record = selectors.record_get(user=request.user, record_id=pk)
        record = services.record_delete_request(record=record, actor=request.user)
        if request.query_params.get("wait", "").lower() in {"1", "true", "yes"}:
            timeout = int_param(request.query_params, "timeout", 60, 1, MAX_WAIT_SECONDS)
            deadline = time.monotonic() + timeout
            while record.phase != Phase.DELETED and time.monotonic() < deadline:
                time.sleep(0.1)
                record = Record.objects.get(pk=record.pk)
        code = status.HTTP_200_OK if record.phase == Phase.DELETED else status.HTTP_202_ACCEPTED
        return Response(_detail(record), status=code)

    @extend_schema(
        parameters=[OpenApiParameter("depth", int, description="levels below the record (default 3, at most 10)")],
        responses=TreeNode,
    )
    @action(detail=True, methods=["get"])
    def tree(self, request: Request, pk: str) -> Response:
        record = selectors.record_get(user=request.user, record_id=pk)
        depth = int_param(request.query_params, "depth", 3, 0, MAX_TREE_DEPTH)
        nodes = selectors.record_subtree(record=record, depth=depth)
        by_id: dict[Any, dict[str, Any]] = {}
        root: dict[str, Any] = {}
        for node in nodes:
            item: dict[str, Any] = {
                "id": str(node.pk),
                "kind": node.kind,
                "name": node.name,
                "phase": node.phase,
                "expires_at": node.expires_at.isoformat() if node.expires_at else None,
                "children": [],
                "truncated": node.level == record.level + depth and not node.is_leaf_node(),
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
            OpenApiParameter(
                "tail",
                int,
                description="only the last N lines (1-10000), oldest first; `next` continues after them (follow)",
            ),
        ],
        responses=LogLineOutput(many=True),
    )
    @action(detail=True, methods=["get"], pagination_class=OldestFirstById)
    def logs(self, request: Request, pk: str) -> Response:
        """The record's log lines (a run's include everything it declared), oldest first."""
        lines, covered = log_rows(request.user, pk, request.query_params)
        rows = lines.values(*LOG_FIELDS)
        if request.query_params.get("tail"):
            response = self._logs_tail(request, rows, int_param(request.query_params, "tail", 0, 1, 10_000))
        else:
            page = self.paginate_queryset(rows)
            response = self.get_paginated_response(log_output(page or []))
        # Never silent: how many lines the log bounds removed from what this view covers.
        response.data["dropped"] = log_dropped(covered)
        return response

    @extend_schema(
        parameters=[
            *LOG_FILTER_PARAMS,
            OpenApiParameter("after", int, description="start after this line id (or the Last-Event-ID header)"),
            OpenApiParameter("tail", int, description="start with the last N lines (default: from the first line)"),
        ],
        responses={(200, "text/event-stream"): str},
    )
    @action(detail=True, methods=["get"], url_path="logs/stream", renderer_classes=[EventStreamRenderer])
    def logs_stream(self, request: Request, pk: str) -> StreamingHttpResponse:
        """Follow the record's log live as server-sent events: one ``log`` event per line
        (``id`` = the line id, ``data`` = the line as JSON), a comment as keep-alive every
        15 s. Reconnecting clients resume after the ``Last-Event-ID`` they saw."""
        rows, _covered = log_rows(request.user, pk, request.query_params)
        after = log_start(rows, request.query_params, request.headers.get("Last-Event-ID", ""))
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


class KindViewSet(viewsets.ViewSet):
    """The kind dictionary: every installed kind with its spec JSON Schema."""

    lookup_value_regex = r"[^/]+"

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


class OrphanViewSet(viewsets.GenericViewSet):
    """What the orphan sweeper found: external objects whose record was gone."""

    pagination_class = OldestFirstById
    serializer_class = EventOutput
    queryset = Record.objects.none()

    @extend_schema(responses=EventOutput(many=True))
    def list(self, request: Request) -> Response:
        sweeper = services.record_ensure_root(kind="graphene.sweeper", name=services.SWEEPER_NAME)
        events = selectors.record_events(record=sweeper).filter(
            type__in=[EventType.ORPHAN_DELETED, EventType.ORPHAN_DELETE_FAILED]
        )
        page = self.paginate_queryset(events)
        return self.get_paginated_response(EventOutput(page, many=True).data)

    @extend_schema(
        request=None,
        parameters=[OpenApiParameter("dry_run", bool, description="only list what would be deleted")],
        responses={200: dict},
    )
    @action(detail=False, methods=["post"])
    def sweep(self, request: Request) -> Response:
        """Run the sweeper now (it also runs every 10 minutes)."""
        dry_run = request.query_params.get("dry_run", "").lower() in {"1", "true", "yes"}
        findings = services.records_sweep(dry_run=dry_run)
        return Response({"dry_run": dry_run, "found": len(findings), "orphans": findings})
