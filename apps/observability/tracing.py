"""Spans: OpenTelemetry-shaped records of timed work, stored in PostgreSQL.

A tiny recorder rather than the OpenTelemetry SDK: the spans' home is the database (the
trace of a run is read by run id, next to its journal), the SDK's context propagation has
nothing to propagate inside one engine call, and its per-span machinery (processors,
resources, a span object per call) is overhead on the step path that buys nothing here.
The ids and fields follow OpenTelemetry (128-bit trace id, 64-bit span id as hex, status
unset/ok/error, attributes), so exporting to an OTLP collector later is a mapping, not a
redesign.

How spans are written, by where they happen:

* **Run steps** (the engine's hot path): buffered per execution in ``RunTelemetry`` and
  written in one transaction (a COPY per table) when the execution ends (suspends,
  finishes, fails or loses its lease), every ``GRAPHENE_RUN_LEASE_SECONDS / 3`` by the
  lease heartbeat, or at 500 buffered spans. A step adds no statement and no transaction. A worker killed with
  SIGKILL loses the spans of its unflushed steps; the journal still has the steps.
* **Convergence, deletion batches, agent commands**: written by the subscribers of the
  domain events that report them (``subscribers.py``), right after the transaction that
  records the outcome commits (one bulk INSERT per event). A span never describes an outcome
  that was rolled back; a process killed between the commit and the INSERT loses that span.

Export: when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, every span written here is also queued,
once its transaction commits, for export over OTLP/HTTP (``otlp.py``), plus the run's root
span when an execution ends the run (it is not stored: see below).

Trace ids: a run's trace id is its run id (a UUID is 128 bits); the root span (the run
itself) has a span id derived from the run id and is built from the run's row when the
trace is read, so it is right whatever ended the run (the engine, a cancel, a timeout).
Records a run created belong to its trace; other records each have a trace of their own
(their id).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import uuid
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction
from django.utils import timezone

from apps.core.db import insert_rows, is_postgresql
from apps.observability import otlp
from apps.observability.models import Span, SpanStatus

if TYPE_CHECKING:
    from apps.core.domain import RecordRef
    from apps.pipelines.models import Run

logger = logging.getLogger(__name__)

# Spans buffered by one execution before they are written without waiting for its end.
FLUSH_AT = 500
MAX_MESSAGE = 500
STEP_DURATION = "step_duration_seconds"
_Step = tuple[str, int, datetime, datetime, int, str, str]
_SPAN_COLUMNS = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "record_id",
    "run_id",
    "started_at",
    "ended_at",
    "status",
    "status_message",
    "attributes",
)
_POINT_COLUMNS = ("record_id", "name", "labels", "at", "value")


def now() -> datetime:
    return timezone.now()


def new_span_id() -> str:
    return os.urandom(8).hex()


def trace_id_of(value: Any) -> str:
    """The trace id of a run (or of a record outside any run): its UUID as 32 hex digits."""
    return uuid.UUID(str(value)).hex


def run_span_id(run_id: Any) -> str:
    """The root span of a run's trace: the same id in every execution attempt."""
    return hashlib.blake2b(f"graphene.run:{uuid.UUID(str(run_id))}".encode(), digest_size=8).hexdigest()


def message(error: BaseException | str) -> str:
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}".rstrip(": ")
    return text.strip()[:MAX_MESSAGE]


@lru_cache(maxsize=8192)
def _run_of_root(root_id: str) -> str:
    """The run whose tree a root record is: a run's id is its first root record's id, and a run
    resumed after its tree was deleted has a newer root whose spec names the run
    (``{"run": id}``). Immutable, so cached."""
    from apps.records.models import Record

    spec = Record.objects.filter(pk=root_id).values_list("spec", flat=True).first()
    run = spec.get("run") if isinstance(spec, dict) else None
    return str(run or root_id)


def record_trace(record: RecordRef) -> tuple[str, str, str | None]:
    """(trace id, parent span id, run id) for work on ``record``: its run's trace under the
    run's root span, or a trace of the record's own."""
    if record.run_root_id is None:
        return trace_id_of(record.id), "", None
    run_id = _run_of_root(record.run_root_id)
    return trace_id_of(run_id), run_span_id(run_id), run_id


def root_trace(root_record_id: Any) -> tuple[str, str, str]:
    """(trace id, parent span id, run id) of the run whose root record this is."""
    run_id = _run_of_root(str(root_record_id))
    return trace_id_of(run_id), run_span_id(run_id), run_id


def spans_write(spans: list[Span]) -> None:
    """Insert spans in one statement (in the caller's transaction, if any); export them over
    OTLP once that commits, if export is on."""
    if spans:
        insert_rows(Span, spans)
        _export_on_commit([otlp.SpanData.of(span) for span in spans] if otlp.exporter() else [])


def _export_on_commit(spans: list[otlp.SpanData]) -> None:
    """Queue spans for OTLP export when the current transaction commits (at once outside one):
    a collector never sees a span the database rolled back."""
    if spans:
        transaction.on_commit(lambda: otlp.export(spans), robust=True)


class RunTelemetry:
    """Spans and step-duration points of one execution attempt of a run, written in batches.

    The engine's thread appends; the lease heartbeat's thread may flush: a lock guards the
    buffers. Failures to write are logged and dropped: telemetry never fails a run.
    """

    def __init__(self, run: Run) -> None:
        self.run_id = str(run.pk)
        self.record_id = run.record_id
        self.pipeline = getattr(run.pipeline, "name", "") if run.pipeline_id else ""
        self.trace_id = trace_id_of(run.pk)
        self.root_span = run_span_id(run.pk)
        self.attempt = run.attempt
        self.run_number = run.number
        self.run_created_at = run.created_at
        self.started_at = now()
        self.span_id = new_span_id()
        self._steps: list[_Step] = []  # (name, seq, started_at, ended_at, attempts, guarantee, error)
        self._spans: list[Span] = []
        self.steps = 0
        self._lock = threading.Lock()
        self._ended = False

    def step(
        self, name: str, seq: int, started_at: datetime, *, attempts: int, guarantee: str, error: str = ""
    ) -> None:
        """A step ran (all its attempts) and its outcome was journaled. Only a tuple is kept
        here; the span and the point are built when the buffer is written."""
        with self._lock:
            self.steps += 1
            self._steps.append((name, seq, started_at, now(), attempts, guarantee, error))
            full = len(self._steps) >= FLUSH_AT
        if full:
            self.flush()

    def _insert_steps(self, steps: list[_Step]) -> list[otlp.SpanData]:
        """The steps' spans and duration points, built as plain parameters (model instances and
        ``bulk_create`` cost ~0.2 ms per step here). Returns the spans to export (none when
        export is off)."""
        if not steps:
            return []
        exporting = otlp.exporter() is not None
        exported: list[otlp.SpanData] = []
        postgres = is_postgresql()
        at = connection.ops.adapt_datetimefield_value

        def uuid_param(value: Any) -> Any:
            if value is None:
                return None
            value = uuid.UUID(str(value))
            return value if postgres else value.hex

        record_id, run_id = uuid_param(self.record_id), uuid_param(self.run_id)
        span_rows: list[tuple[Any, ...]] = []
        point_rows: list[tuple[Any, ...]] = []
        for name, seq, started_at, ended_at, attempts, guarantee, error in steps:
            attributes = {
                "graphene.step": name,
                "graphene.seq": seq,
                "graphene.attempts": attempts,
                "graphene.guarantee": guarantee,
                "graphene.run.attempt": self.attempt,
            }
            span_id, span_name = new_span_id(), f"step {name}"[:200]
            status, status_message = (SpanStatus.ERROR.value, message(error)) if error else (SpanStatus.OK.value, "")
            span_rows.append(
                (
                    self.trace_id,
                    span_id,
                    self.root_span,
                    span_name,
                    record_id,
                    run_id,
                    at(started_at),
                    at(ended_at),
                    status,
                    status_message,
                    json.dumps(attributes),
                )
            )
            if exporting:
                exported.append(
                    otlp.SpanData(
                        trace_id=self.trace_id,
                        span_id=span_id,
                        parent_span_id=self.root_span,
                        name=span_name,
                        started_at=started_at,
                        ended_at=ended_at,
                        status=status,
                        status_message=status_message,
                        attributes=attributes,
                        record_id=self.record_id,
                        run_id=self.run_id,
                    )
                )
            if record_id is not None:
                seconds = (ended_at - started_at).total_seconds()
                point_rows.append((record_id, STEP_DURATION, json.dumps({"step": name}), at(ended_at), seconds))
        with connection.cursor() as cursor:
            if postgres:
                # COPY: several times faster than a multi-row INSERT, which psycopg re-parses on
                # every call when it binds parameters client-side (as Django's cursor does).
                for table, columns, rows in (
                    ("observability_span", _SPAN_COLUMNS, span_rows),
                    ("observability_metricpoint", _POINT_COLUMNS, point_rows),
                ):
                    if rows:
                        with cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                            for row in rows:
                                copy.write_row(row)
            else:  # SQLite (embedded): its executemany binds in C
                for table, columns, rows in (
                    ("observability_span", _SPAN_COLUMNS, span_rows),
                    ("observability_metricpoint", _POINT_COLUMNS, point_rows),
                ):
                    if rows:
                        # Constant table and column names; the values go as parameters.
                        sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})"  # noqa: S608
                        cursor.executemany(sql, rows)
        return exported

    def flush(self) -> None:
        with self._lock:
            steps, self._steps = self._steps, []
            spans, self._spans = self._spans, []
        if not steps and not spans:
            return
        try:
            with transaction.atomic():
                exported = self._insert_steps(steps)
                _export_on_commit(exported)
                spans_write(spans)
        except Exception:
            logger.warning("run %s: could not write %d span(s)", self.run_id, len(steps) + len(spans), exc_info=True)

    def end(self, outcome: str, error: str = "") -> None:
        """The execution attempt ended (``suspended``, ``succeeded``, ``failed``, ``fenced``,
        ``aborted``): its span, the run's duration if it ended here, and a flush."""
        if self._ended:
            return
        self._ended = True
        ended = now()
        failed = outcome in ("failed", "aborted")
        span = Span(
            trace_id=self.trace_id,
            span_id=self.span_id,
            parent_span_id=self.root_span,
            name=f"execute #{self.attempt}",
            record_id=self.record_id,
            run_id=self.run_id,
            started_at=self.started_at,
            ended_at=ended,
            status=SpanStatus.ERROR if failed else SpanStatus.OK,
            status_message=message(error) if failed and error else "",
            attributes={
                "graphene.run.attempt": self.attempt,
                "graphene.outcome": outcome,
                "graphene.steps": self.steps,
            },
        )
        with self._lock:
            self._spans.append(span)
        self.flush()
        if outcome in ("succeeded", "failed") and otlp.exporter() is not None:
            self._export_run_span(outcome, ended, error)

    def _export_run_span(self, outcome: str, ended: datetime, error: str) -> None:
        """The run's root span, for the collector only: the database builds it from the run's
        row when a trace is read (``selectors._run_node``, whose fields these are). Sent when
        the engine ends the run; a run ended elsewhere (cancelled, timed out) has none there."""
        try:
            failed = outcome == "failed"
            span = otlp.SpanData(
                trace_id=self.trace_id,
                span_id=self.root_span,
                parent_span_id="",
                name=f"run {self.pipeline}#{self.run_number}",
                started_at=self.run_created_at or self.started_at,
                ended_at=ended,
                status=SpanStatus.ERROR.value if failed else SpanStatus.OK.value,
                status_message=(message(error) or outcome) if failed else "",
                attributes={
                    "graphene.pipeline": self.pipeline,
                    "graphene.run.number": self.run_number,
                    "graphene.run.status": outcome,
                    "graphene.run.attempts": self.attempt,
                },
                record_id=self.record_id,
                run_id=self.run_id,
            )
            otlp.export([span])
        except Exception:
            logger.warning("run %s: could not export the run's span", self.run_id, exc_info=True)
