"""Writes of observability data: log lines, per-record metric points, and the retention purge."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, QuerySet, Sum
from django.utils import timezone

from apps.core.db import is_postgresql
from apps.core.errors import ValidationFailed
from apps.observability.models import LogDrop, LogLine, LogTrimMark, MetricPoint, Span

SEVERITIES = ("debug", "info", "warning", "error")
# Prometheus' metric and label name rules, so that series can be exported as they are.
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,199}")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,62}")
MAX_LABELS = 10
MAX_LABEL_VALUE = 200
# Rows deleted per statement by the purge, and statements per purge call (bounded work).
PURGE_BATCH = 10_000
PURGE_ROUNDS = 50


# --- the live stream's horizon ----------------------------------------------------------------
#
# A live log stream follows lines by id, and an id is taken when its line is inserted but
# seen only when its transaction commits: two writers commit in either order, so a stream
# that moved past a later id would never send an earlier one committed after it. Each
# transaction that writes lines therefore announces, before it takes an id, the last id
# taken so far: a shared advisory lock (held to its end, visible to every session at once)
# whose key is that id in LOG_WRITER_LOCKS' key space. A stream sends only lines up to
# ``observability.selectors.log_horizon``: below every announcement still held, and below
# the last id taken before it looked (a writer announcing later takes higher ids). Writers
# never wait on each other; the sequence must keep its default cache of 1.
LOG_WRITER_LOCKS = 0x6C6F67 << 40  # "log": keys LOG_WRITER_LOCKS + id, ids below 2**40
_LOG_SEQUENCE: list[str] = []


def log_sequence(connection: Any) -> str:
    """The name of the sequence that numbers log lines (PostgreSQL); never called, it has
    taken none (``pg_sequence_last_value`` is null, and the first id is 1)."""
    if not _LOG_SEQUENCE:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [LogLine._meta.db_table])
            _LOG_SEQUENCE.append(cursor.fetchone()[0])
    return _LOG_SEQUENCE[0]


def _announce_writer() -> None:
    """Announce this transaction as a log writer, once (a transaction-local setting says it did)."""
    if not is_postgresql():
        return  # SQLite: one writer at a time, which commits before the next takes an id
    connection = transaction.get_connection()
    sequence = log_sequence(connection)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock_shared(%s + coalesce(pg_sequence_last_value(%s::regclass), 0)),"
            "  set_config('graphene.log_writer', 'on', true) "
            "WHERE current_setting('graphene.log_writer', true) IS DISTINCT FROM 'on'",
            [LOG_WRITER_LOCKS, sequence],
        )


def log_write(
    *, record_id: Any, message: str, severity: str = "info", source: str = "", stream: str = "stdout"
) -> LogLine:
    """Append a line to a record's log."""
    if severity not in SEVERITIES:
        severity = "info"
    with transaction.atomic(savepoint=False):
        _announce_writer()
        return LogLine.objects.create(
            record_id=record_id,
            at=timezone.now(),
            stream=stream,
            severity=severity,
            source=source[:120],
            message=message,
        )


@dataclass(frozen=True)
class LogEntry:
    """One line for ``log_write_many``."""

    record_id: Any
    message: str
    stream: str = "stdout"
    severity: str = "info"
    source: str = ""
    at: datetime | None = None


LOG_COLUMNS = ("record_id", "at", "stream", "severity", "source", "message")


def _text(value: str) -> str:
    # PostgreSQL text cannot hold NUL; a program printing one must not make its output unstorable.
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


# COPY's text format: a backslash, tab, newline or carriage return in a value is escaped.
_COPY_SPECIAL = ("\\", "\t", "\r", "\x00")


def _copy_value(value: str, *, newlines: bool = True) -> str:
    """A text value as a field of COPY's text format (NUL as U+FFFD, see ``_text``);
    ``newlines=False`` leaves newlines alone (rows the caller joined with them)."""
    if any(c in value for c in _COPY_SPECIAL):
        value = value.replace("\\", "\\\\").replace("\t", "\\t").replace("\r", "\\r").replace("\x00", "\ufffd")
    if newlines and "\n" in value:
        value = value.replace("\n", "\\n")
    return value


def _copy_lines(rows: Iterable[str]) -> None:
    """Send COPY text-format rows (each ending in a newline) in one ``COPY`` on PostgreSQL,
    announced (``_announce_writer``) in the caller's transaction, or in one of its own."""
    statement = f"COPY {LogLine._meta.db_table} ({', '.join(LOG_COLUMNS)}) FROM STDIN"
    connection = transaction.get_connection()
    # errors="replace": a lone surrogate (only a broken client can send one) must not make a
    # chunk unstorable, or its sender would re-send it forever.
    data = "".join(rows).encode("utf-8", "replace")
    with transaction.atomic(savepoint=False):
        _announce_writer()
        with connection.cursor() as wrapper, wrapper.cursor.copy(statement) as copy:
            copy.write(data)


def log_write_many(entries: Iterable[LogEntry]) -> int:
    """Append many lines at once, in the caller's transaction.

    On PostgreSQL one ``COPY``: an agent streams tens of thousands of lines a second, and
    building a model instance and SQL parameters per line cost ~80 us of the gateway's CPU
    per line (bench/agent_logs.py); ``COPY`` rows cost a few. Elsewhere (SQLite, embedded
    mode) ``bulk_create``. Neither sends signals.
    """
    now = timezone.now()
    rows = [
        (
            e.record_id,
            e.at or now,
            e.stream,
            e.severity if e.severity in SEVERITIES else "info",
            _text(e.source[:120]),
            _text(e.message),
        )
        for e in entries
    ]
    if not rows:
        return 0
    if is_postgresql():
        _copy_lines(
            f"{record_id}\t{at.isoformat()}\t{_copy_value(stream)}\t{severity}\t{_copy_value(source)}\t"
            f"{_copy_value(message)}\n"
            for record_id, at, stream, severity, source, message in rows
        )
    else:
        lines = [LogLine(**dict(zip(LOG_COLUMNS, row, strict=True))) for row in rows]
        with transaction.atomic(savepoint=False):
            LogLine.objects.bulk_create(lines, batch_size=1000)
    return len(rows)


def log_write_lines(
    *,
    record_ids: Sequence[Any],
    lines: Sequence[str],
    stream: str = "stdout",
    severity: str = "info",
    source: str = "",
    at: datetime | None = None,
) -> int:
    """Append the same lines to each of ``record_ids``' logs (all fields but the message
    shared: a command's output chunk), in the caller's transaction; returns the rows written.

    The gateway stores every line an agent prints through this (bench/agent_logs.py): on
    PostgreSQL the rows are one ``COPY`` buffer built with a few string operations per
    chunk, not per line (``psycopg``'s ``write_row`` cost ~5 us of the web process's CPU per
    line). Elsewhere ``log_write_many``.
    """
    if not lines or not record_ids:
        return 0
    at = at or timezone.now()
    if severity not in SEVERITIES:
        severity = "info"
    if not is_postgresql():
        return log_write_many(
            LogEntry(record_id=r, message=m, stream=stream, severity=severity, source=source, at=at)
            for r in record_ids
            for m in lines
        )
    text = "\n".join(lines)
    if text.count("\n") != len(lines) - 1:  # a line holds a newline (never in a command's output)
        text = "\n".join(_copy_value(line) for line in lines)
    else:  # the joining newlines are the rows' ends; the rest is escaped in one pass
        text = _copy_value(text, newlines=False)
    fields = f"\t{at.isoformat()}\t{_copy_value(stream)}\t{severity}\t{_copy_value(_text(source[:120]))}\t"
    _copy_lines(
        f"{record_id}{fields}" + f"\n{record_id}{fields}".join(text.split("\n")) + "\n" for record_id in record_ids
    )
    return len(lines) * len(record_ids)


def logs_trim(*, now: datetime | None = None) -> dict[str, int]:
    """Keep logs within their bounds: lines older than ``GRAPHENE_LOG_RETENTION`` go, and a
    record keeps its newest ``GRAPHENE_LOG_MAX_LINES_PER_RECORD``. What goes is counted per
    record (``LogDrop``, shown with its logs) and told in one ``logs_trimmed`` event each.

    The bound is checked only for records that wrote since the last check (lines after the
    ``LogTrimMark``), each through the (record, id) index: cost follows what was written,
    not the size of the table.
    """
    from collections import Counter

    now = now or timezone.now()
    dropped: Counter[Any] = Counter()
    cutoff = now - settings.GRAPHENE_LOG_RETENTION
    for _ in range(PURGE_ROUNDS):
        rows = list(LogLine.objects.filter(at__lt=cutoff).order_by("at").values_list("pk", "record_id")[:PURGE_BATCH])
        if not rows:
            break
        with transaction.atomic():
            LogLine.objects.filter(pk__in=[pk for pk, _ in rows]).delete()
        dropped.update(record_id for _, record_id in rows)
        if len(rows) < PURGE_BATCH:
            break
    aged = sum(dropped.values())
    bound = settings.GRAPHENE_LOG_MAX_LINES_PER_RECORD
    mark, _ = LogTrimMark.objects.get_or_create(name="bounds")
    newest = LogLine.objects.order_by("-id").values_list("id", flat=True).first() or mark.last_id
    writers = LogLine.objects.filter(id__gt=mark.last_id, id__lte=newest).values_list("record_id", flat=True)
    for record_id in set(writers):
        beyond = list(
            LogLine.objects.filter(record_id=record_id).order_by("-id").values_list("id", flat=True)[bound : bound + 1]
        )
        if beyond:
            with transaction.atomic():
                dropped[record_id] += LogLine.objects.filter(record_id=record_id, id__lte=beyond[0]).delete()[0]
    LogTrimMark.objects.filter(name="bounds").update(last_id=newest)
    _report_drops(dropped, now)
    return {"aged": aged, "bounded": sum(dropped.values()) - aged, "records": len(dropped)}


def _report_drops(dropped: Mapping[Any, int], now: datetime) -> None:
    from apps.records.choices import EventType
    from apps.records.models import Record
    from apps.records.services import record_event_write

    live = set(Record.objects.filter(pk__in=list(dropped)).values_list("pk", flat=True))
    for record_id, lines in dropped.items():
        if record_id not in live or not lines:
            continue
        with transaction.atomic():
            updated = LogDrop.objects.filter(record_id=record_id).update(lines=F("lines") + lines, updated_at=now)
            if not updated:
                LogDrop.objects.create(record_id=record_id, lines=lines, updated_at=now)
            record_event_write(
                record_id,
                EventType.LOGS_TRIMMED,
                reason="LogsTrimmed",
                message=f"{lines} log line(s) removed by the log bounds (age or lines per record)",
                data={"lines": lines},
            )


def log_dropped(record_ids: Iterable[Any]) -> int:
    """Lines the bounds removed from these records' logs so far (``record_ids``: ids, or a
    ``values_list`` queryset used as a subquery)."""
    ids = record_ids if isinstance(record_ids, QuerySet) else list(record_ids)
    total = LogDrop.objects.filter(record_id__in=ids).aggregate(n=Sum("lines"))["n"]
    return int(total or 0)


@dataclass(frozen=True)
class Sample:
    """One value of a record's series, for ``metric_write_many``."""

    record_id: Any
    name: str
    value: float
    at: datetime | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


def _point(sample: Sample, now: datetime) -> MetricPoint:
    if not METRIC_NAME.fullmatch(sample.name or ""):
        raise ValidationFailed(
            f"metric name {sample.name!r} must match [a-zA-Z_:][a-zA-Z0-9_:]* (at most 200 characters)",
            fields={"name": ["invalid metric name"]},
        )
    try:
        value = float(sample.value)
    except (TypeError, ValueError):
        raise ValidationFailed(
            f"{sample.name}: value {sample.value!r} is not a number", fields={"value": ["not a number"]}
        ) from None
    if not math.isfinite(value):
        raise ValidationFailed(f"{sample.name}: value must be finite, not {value}", fields={"value": ["not finite"]})
    labels = dict(sample.labels or {})
    if len(labels) > MAX_LABELS or not all(
        isinstance(k, str) and LABEL_NAME.fullmatch(k) and isinstance(v, str) and len(v) <= MAX_LABEL_VALUE
        for k, v in labels.items()
    ):
        raise ValidationFailed(
            f"{sample.name}: labels must map at most {MAX_LABELS} names ([a-zA-Z_][a-zA-Z0-9_]*) to strings "
            f"of at most {MAX_LABEL_VALUE} characters",
            fields={"labels": ["invalid labels"]},
        )
    at = sample.at or now
    if timezone.is_naive(at):
        raise ValidationFailed(f"{sample.name}: 'at' must be timezone-aware", fields={"at": ["naive datetime"]})
    return MetricPoint(record_id=sample.record_id, name=sample.name, labels=labels, at=at, value=value)


def metric_write(
    *, record_id: Any, name: str, value: float, at: datetime | None = None, labels: Mapping[str, str] | None = None
) -> MetricPoint:
    """Add one point to the record's series ``name`` (and ``labels``) at ``at`` (default now)."""
    point = _point(Sample(record_id, name, value, at, labels or {}), timezone.now())
    point.save(force_insert=True)
    return point


def metric_write_many(*, samples: Iterable[Sample]) -> int:
    """Add many points in one statement (all validated first: all or nothing)."""
    now = timezone.now()
    points = [_point(sample, now) for sample in samples]
    MetricPoint.objects.bulk_create(points)
    return len(points)


def _purge(model: type[MetricPoint] | type[Span], column: str, cutoff: datetime) -> int:
    deleted = 0
    for _ in range(PURGE_ROUNDS):
        ids = list(
            model.objects.filter(**{f"{column}__lt": cutoff})
            .order_by(column)
            .values_list("pk", flat=True)[:PURGE_BATCH]
        )
        if not ids:
            break
        with transaction.atomic():
            deleted += model.objects.filter(pk__in=ids).delete()[0]
        if len(ids) < PURGE_BATCH:
            break
    return deleted


def observability_purge(*, now: datetime | None = None) -> dict[str, int]:
    """Delete metric points and spans older than their retention, in bounded batches (the
    beat runs this hourly; a backlog larger than one call's share is taken by the next)."""
    now = now or timezone.now()
    return {
        "metric_points": _purge(MetricPoint, "at", now - settings.GRAPHENE_METRIC_POINTS_RETENTION),
        "spans": _purge(Span, "started_at", now - settings.GRAPHENE_SPANS_RETENTION),
    }
