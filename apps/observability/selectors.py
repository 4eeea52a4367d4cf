"""Reads of observability data: a record's (or subtree's) log lines and their live follow
(shared by the REST views, the server-sent events and the websocket), a record's metric
series aggregated per step, and a trace as a span tree."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.db.models import BigIntegerField, Func, QuerySet, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from apps.core.db import is_postgresql, release_pooled_connection
from apps.core.errors import ValidationFailed
from apps.observability.models import LogLine, MetricPoint, Span, SpanStatus
from apps.observability.services import LOG_WRITER_LOCKS, METRIC_NAME, SEVERITIES, log_sequence
from apps.records.models import Record
from apps.records.selectors import subtree_of


def log_lines(
    *,
    record: Record,
    include_descendants: bool = True,
    grep: str | None = None,
    min_severity: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[LogLine]:
    if include_descendants and not record.is_leaf_node():
        # The subtree's ids first (an index range on the tree), then its lines through the
        # (record, id) index: as one join the planner may scan the whole table instead.
        qs = LogLine.objects.filter(record_id__in=list(subtree_of(record).values_list("pk", flat=True)))
    else:
        qs = LogLine.objects.filter(record=record)
    if grep:
        qs = qs.filter(message__icontains=grep)
    if min_severity:
        if min_severity not in SEVERITIES:
            raise ValidationFailed(f"severity must be one of {[*SEVERITIES]}", fields={"severity": [min_severity]})
        qs = qs.filter(severity__in=SEVERITIES[SEVERITIES.index(min_severity) :])
    if since:
        qs = qs.filter(at__gte=since)
    if until:
        qs = qs.filter(at__lt=until)
    return qs.select_related("record").order_by("id")


def log_horizon() -> int | None:
    """The highest line id a live stream may send now (``services.LOG_WRITER_LOCKS`` says
    why): no line at or below it can still appear. ``None``: no bound (SQLite)."""
    if not is_postgresql():
        return None
    with connection.cursor() as cursor:
        # The last id taken first: a writer that announces after this line takes higher ids.
        cursor.execute("SELECT coalesce(pg_sequence_last_value(%s::regclass), 0)", [log_sequence(connection)])
        (taken,) = cursor.fetchone()
        cursor.execute(
            "SELECT min(((classid::bigint << 32) | objid::bigint) - %s) FROM pg_locks"
            " WHERE locktype = 'advisory' AND objsubid = 1 AND classid::bigint >= %s AND classid::bigint < %s"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND pid <> pg_backend_pid()",  # its own lines, committed or not, this session sees
            [LOG_WRITER_LOCKS, LOG_WRITER_LOCKS >> 32, (LOG_WRITER_LOCKS >> 32) + (1 << 8)],
        )
        (announced,) = cursor.fetchone()
    return int(taken) if announced is None else min(int(taken), int(announced))


# --- the live follow: the REST shape, batches by id up to the horizon -------------------------

LOG_FIELDS = ("id", "record_id", "record__name", "at", "stream", "severity", "source", "message")


def _at_format() -> Any:
    """``DateTimeField().to_representation`` for the rows of one page: the current time zone
    looked up once, not per line (per line it was a third of a live log stream's CPU,
    bench/agent_logs.py); the same text (ISO 8601, ``Z`` for UTC)."""
    zone = timezone.get_current_timezone()

    def at(value: datetime) -> str:
        if timezone.is_naive(value):  # as DRF's DateTimeField takes it: a time in the current zone
            value = timezone.make_aware(value, zone)
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


LOG_STREAM_POLL_SECONDS = 0.25
# Lines per fetch of a live stream: a fast writer's backlog is read in few queries.
LOG_STREAM_BATCH = 5000


class _EpochMicros(Func):
    """A time as whole microseconds since 1970 (PostgreSQL). An integer is read in C, where a
    timestamp went through Django's time-zone loader in Python (a quarter of a live stream's
    CPU in the web process, bench/agent_logs.py) and ``to_char`` cost PostgreSQL 1.6 us a row.
    Exact: a float8 holds today's times to a fraction of a microsecond."""

    output_field = BigIntegerField()
    template = "round(date_part('epoch', %(expressions)s) * 1000000)::bigint"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
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
    postgresql = is_postgresql(rows.db)
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
            ats = {value: at(_EPOCH + timedelta(microseconds=value)) for value in {row[2] for row in fetched}}
        else:
            ats = {value: at(value) for value in {row[2] for row in fetched}}
    return LogBatch(fetched, records, ats)


def _log_fetch_released(rows: Any, after: int) -> LogBatch:
    """``log_fetch``, giving the connection back to the web's pool between polls: a follow
    lasts as long as its client stays, and must not hold a connection of the bounded pool."""
    try:
        return log_fetch(rows, after)
    finally:
        release_pooled_connection()


async def log_batches(
    rows: Any,
    after: int,
    *,
    on_thread: Callable[[Callable[[Any, int], LogBatch]], Callable[[Any, int], Awaitable[LogBatch]]] = sync_to_async,
) -> AsyncIterator[LogBatch]:
    """Lines stored after line ``after`` (``LogBatch``), polled by id (the (record, id) index)
    a few times a second, at once again while a backlog fills whole batches; an empty batch
    when a poll found nothing (for keep-alives). Serves the server-sent events and the
    websocket.

    ``on_thread`` runs each poll. By default on the request's own thread (server-sent events:
    its first poll gives back the connection the request borrowed before it began to stream,
    which would otherwise be held to the stream's end); websocket consumers pass
    ``apps.core.db.on_db_thread``."""
    fetch = on_thread(_log_fetch_released)
    while True:
        batch = await fetch(rows, after)
        if batch:
            after = batch.last_id
        yield batch
        if len(batch) < LOG_STREAM_BATCH:
            await asyncio.sleep(LOG_STREAM_POLL_SECONDS)


def log_start(rows: Any, *, after: int = 0, tail: int = 0, last_event_id: int | None = None) -> int:
    """Where a live follow of ``rows`` starts: after ``last_event_id`` (a client reconnecting)
    or ``after``, whichever is later; else before the last ``tail`` lines; else after ``after``
    (0: from the first line)."""
    if last_event_id is not None:
        return max(after, last_event_id)
    if tail:
        newest = list(rows.order_by("-id").values_list("id", flat=True)[:tail])
        return newest[-1] - 1 if newest else 0
    return after


def log_rows(
    *,
    record: Record,
    descendants: bool = True,
    grep: str | None = None,
    min_severity: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> tuple[QuerySet[LogLine], Any]:
    """A record's filtered log lines (``log_lines``) and the ids of the records they cover."""
    covered: Any = subtree_of(record).values_list("pk", flat=True) if descendants else [record.pk]
    lines = log_lines(
        record=record,
        include_descendants=descendants,
        grep=grep,
        min_severity=min_severity,
        since=since,
        until=until,
    )
    return lines, covered


# --- metric series ----------------------------------------------------------------------------

_UNITS = {"w": 604_800, "d": 86_400, "h": 3_600, "m": 60, "s": 1}
_PART = re.compile(r"([0-9]+)([wdhms])")
# What ``parse_duration`` takes, as the API's schema declares it (``?window=``, ``?step=``).
DURATION_PATTERN = r"^([0-9]+|([0-9]+[wdhmsWDHMS])+)$"
# Buckets one series may return (Prometheus refuses more than 11,000 points per series too).
MAX_POINTS = 11_000
# Buckets when the step is not given: the default step (60 s) grows to stay below this.
DEFAULT_POINTS = 1_000
DEFAULT_WINDOW = 3_600
DEFAULT_STEP = 60
MAX_WINDOW = 366 * 86_400
MAX_SERIES = 500


def parse_duration(text: str, *, param: str) -> int:
    """Whole seconds in ``90s``, ``15m``, ``1h30m``, ``1d``, ``1w`` or a bare number of seconds."""
    raw = text.lower()
    if len(raw) > 40:  # a longer one is either malformed or beyond any bound (and int() has a limit)
        raise ValidationFailed(f"{param} is too long to be a duration", fields={param: ["not a duration"]})
    if raw.isascii() and raw.isdigit():
        seconds = int(raw)
    else:
        parts = _PART.findall(raw)
        if not parts or "".join(n + u for n, u in parts) != raw:
            raise ValidationFailed(
                f"{param}={text!r} is not a duration; write it like 90s, 15m, 1h, 1h30m or 7d",
                fields={param: ["not a duration (90s, 15m, 1h, 1h30m, 7d)"]},
            )
        seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds < 1:
        raise ValidationFailed(f"{param} must be at least 1s", fields={param: ["must be at least 1s"]})
    return seconds


@dataclass(frozen=True)
class SeriesQuery:
    """A validated request for a record's series: ``window`` seconds up to ``end``, per ``step``."""

    name: str | None
    window: int
    step: int
    end: datetime

    @property
    def start(self) -> datetime:
        return self.end - timedelta(seconds=self.window)


def series_query(
    *, name: str | None, window: str | None, step: str | None, end: datetime | None, now: datetime
) -> SeriesQuery:
    """Check and complete the parameters (400 with field errors, never a guess)."""
    if name is not None and not METRIC_NAME.fullmatch(name):
        raise ValidationFailed(f"name={name!r} is not a metric name", fields={"name": ["not a metric name"]})
    window_s = parse_duration(window, param="window") if window else DEFAULT_WINDOW
    if window_s > MAX_WINDOW:
        raise ValidationFailed(
            f"window must be at most {MAX_WINDOW // 86_400}d", fields={"window": [f"at most {MAX_WINDOW // 86_400}d"]}
        )
    if step:
        step_s = parse_duration(step, param="step")
        if window_s / step_s > MAX_POINTS:
            raise ValidationFailed(
                f"window {window_s}s / step {step_s}s is more than {MAX_POINTS} points per series; use a larger step",
                fields={"step": [f"at most {MAX_POINTS} points per series"]},
            )
    else:
        step_s = max(DEFAULT_STEP, -(-window_s // DEFAULT_POINTS))
    if step_s > window_s:
        raise ValidationFailed(
            f"step {step_s}s is longer than the window {window_s}s", fields={"step": ["longer than the window"]}
        )
    return SeriesQuery(name=name, window=window_s, step=step_s, end=end or now)


def metric_names(*, record: Record) -> list[str]:
    """The names of the record's series (within retention), one index seek per name."""
    sql = (
        "WITH RECURSIVE names(name) AS ("
        " SELECT (SELECT name FROM observability_metricpoint WHERE record_id = %s ORDER BY name LIMIT 1)"
        " UNION ALL"
        " SELECT (SELECT m.name FROM observability_metricpoint m WHERE m.record_id = %s AND m.name > names.name"
        "  ORDER BY m.name LIMIT 1) FROM names WHERE names.name IS NOT NULL"
        ") SELECT name FROM names WHERE name IS NOT NULL"
    )
    pk = _record_param(record.pk)
    with connection.cursor() as cursor:
        cursor.execute(sql, [pk, pk])
        return [row[0] for row in cursor.fetchall()]


def _record_param(pk: Any) -> Any:
    return MetricPoint._meta.get_field("record").get_db_prep_value(uuid.UUID(str(pk)), connection)


def _bucket_sql() -> tuple[str, str]:
    """(bucket start as epoch seconds, labels as text) in this database's SQL."""
    if is_postgresql():
        return (
            "EXTRACT(EPOCH FROM date_bin(%s * INTERVAL '1 second', at, TIMESTAMPTZ '1970-01-01 00:00:00+00'))",
            "labels::text",
        )
    # SQLite (embedded): datetimes are UTC text; whole seconds suffice as steps are whole seconds.
    return "(CAST(strftime('%%s', at) AS INTEGER) / %s) * %s", "labels"


def metric_series(*, record: Record, query: SeriesQuery) -> dict[str, Any]:
    """The record's series in the window, aggregated per step in SQL: for each bucket (aligned
    to multiples of ``step`` since the Unix epoch) count, avg, min, max and the last value.
    Only buckets with points are returned."""
    names = metric_names(record=record)
    wanted = [query.name] if query.name else names
    body: dict[str, Any] = {
        "record": str(record.pk),
        "name": query.name,
        "start": query.start.isoformat(),
        "end": query.end.isoformat(),
        "window_seconds": query.window,
        "step_seconds": query.step,
        "names": names,
        "series": [],
        "truncated": False,
    }
    if not wanted:
        return body
    bucket, labels = _bucket_sql()
    bucket_params: list[Any] = [query.step] if is_postgresql() else [query.step, query.step]
    in_list = ", ".join(["%s"] * len(wanted))
    sql = (
        # The formatted parts are constant SQL and placeholders; every value goes as a parameter.
        "SELECT name, labels, bucket, COUNT(*), AVG(value), MIN(value), MAX(value),"  # noqa: S608
        " MAX(CASE WHEN rn = 1 THEN value END) FROM ("
        "  SELECT b.name, b.labels, b.value, b.bucket,"
        "   ROW_NUMBER() OVER (PARTITION BY b.name, b.labels, b.bucket ORDER BY b.at DESC, b.id DESC) AS rn"
        f"  FROM (SELECT id, name, {labels} AS labels, value, at, {bucket} AS bucket"
        "   FROM observability_metricpoint"
        f"   WHERE record_id = %s AND name IN ({in_list}) AND at >= %s AND at < %s) b"
        ") p GROUP BY name, labels, bucket ORDER BY name, labels, bucket"
    )
    params = [
        *bucket_params,
        _record_param(record.pk),
        *wanted,
        connection.ops.adapt_datetimefield_value(query.start),
        connection.ops.adapt_datetimefield_value(query.end),
    ]
    series: dict[tuple[str, str], dict[str, Any]] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for name, raw_labels, start, count, avg, low, high, last in cursor.fetchall():
            key = (name, raw_labels or "")
            if key not in series:
                if len(series) >= MAX_SERIES:
                    body["truncated"] = True
                    break
                decoded = json.loads(raw_labels) if isinstance(raw_labels, str) and raw_labels else raw_labels
                series[key] = {"name": name, "labels": decoded or {}, "points": []}
            series[key]["points"].append(
                {
                    "at": datetime.fromtimestamp(int(start), tz=UTC).isoformat(),
                    "count": int(count),
                    "avg": float(avg),
                    "min": float(low),
                    "max": float(high),
                    "last": float(last),
                }
            )
    body["series"] = list(series.values())
    return body


# --- traces -----------------------------------------------------------------------------------

MAX_SPANS = 10_000


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _duration_ms(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds() * 1000, 3)


def span_node(
    *,
    trace_id: str,
    span_id: str,
    parent_span_id: str | None,
    name: str,
    record: str | None,
    run: str | None,
    started_at: datetime | None,
    ended_at: datetime | None,
    status: str,
    status_message: str,
    attributes: dict[str, Any],
) -> dict[str, Any]:
    """A node of a trace tree for something that is not a stored span (a run, built from its
    row): the same shape as a stored span's node."""
    return {
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_span_id": parent_span_id,
        "name": name,
        "record": record,
        "run": run,
        "started_at": _iso(started_at),
        "ended_at": _iso(ended_at),
        "duration_ms": _duration_ms(started_at, ended_at),
        "status": status,
        "status_message": status_message,
        "attributes": attributes,
        "children": [],
    }


def _node(span: Span) -> dict[str, Any]:
    return span_node(
        trace_id=span.trace_id,
        span_id=span.span_id,
        parent_span_id=span.parent_span_id or None,
        name=span.name,
        record=str(span.record_id) if span.record_id else None,
        run=str(span.run_id) if span.run_id else None,
        started_at=span.started_at,
        ended_at=span.ended_at,
        status=span.status,
        status_message=span.status_message,
        attributes=span.attributes,
    )


def trace_tree(
    *, trace_id: str, root: dict[str, Any], extra: list[dict[str, Any]], limit: int = MAX_SPANS
) -> dict[str, Any]:
    """The stored spans of ``trace_id`` (at most ``limit``) and the ``extra`` nodes as a tree
    under ``root``, children in start order. A span whose parent is missing (not yet written,
    or lost with a killed worker) hangs under the root."""
    rows = list(Span.objects.filter(trace_id=trace_id).order_by("started_at", "id")[: limit + 1])
    truncated = len(rows) > limit
    nodes = [_node(span) for span in rows[:limit]]
    nodes.extend(extra)
    return {"trace_id": trace_id, **_tree(root, nodes), "truncated": truncated, "root": root}


def _tree(root: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, int]:
    """Hang ``nodes`` under their parents (under ``root`` when the parent is not among them),
    children in start order; how many spans, and how many of them failed."""
    by_id = {root["span_id"]: root}
    for node in nodes:
        by_id.setdefault(node["span_id"], node)
    for node in nodes:
        parent = by_id.get(node["parent_span_id"] or "") if node["parent_span_id"] != node["span_id"] else None
        (parent or root)["children"].append(node)

    def order(node: dict[str, Any]) -> None:
        node["children"].sort(key=lambda n: (n["started_at"] or "", n["name"]))
        for child in node["children"]:
            order(child)

    order(root)
    errors = sum(1 for n in [root, *nodes] if n["status"] == SpanStatus.ERROR)
    return {"span_count": len(nodes) + 1, "errors": errors}


MAX_RECORD_SPANS = 500


def record_spans(*, record: Record, limit: int = MAX_RECORD_SPANS) -> dict[str, Any]:
    """The work done on ``record`` and its subtree (convergences, deletions, steps, commands) as
    a span tree under the record (the root node spans them all), the first ``limit`` spans
    by start (through the spans' (record, started_at) index)."""
    rows = list(
        Span.objects.filter(record_id__in=subtree_of(record).values("pk")).order_by("started_at", "id")[: limit + 1]
    )
    truncated = len(rows) > limit
    nodes = [_node(span) for span in rows[:limit]]
    starts = [span.started_at for span in rows[:limit]]
    ends = [span.ended_at for span in rows[:limit]]
    root = span_node(
        trace_id="",
        span_id=f"record:{record.pk}",
        parent_span_id=None,
        name=str(record),
        record=str(record.pk),
        run=None,
        started_at=min(starts) if starts else record.created_at,
        ended_at=max(ends) if ends else record.created_at,
        status=SpanStatus.UNSET,
        status_message="",
        attributes={"graphene.record.kind": record.kind, "graphene.record.phase": record.phase},
    )
    return {"record": str(record.pk), **_tree(root, nodes), "truncated": truncated, "root": root}
