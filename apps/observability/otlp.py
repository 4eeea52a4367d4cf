"""Span export over OTLP/HTTP (protobuf), on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set.

PostgreSQL stays the spans' home; a collector (Jaeger, Tempo, an OpenTelemetry Collector)
gets a copy of what the recorder in ``tracing.py`` committed. Built from the message classes
of ``opentelemetry-proto`` and sent with ``urllib``, rather than through the SDK's
``OTLPSpanExporter``: that exporter takes SDK ``ReadableSpan`` objects (so the SDK, its
resources, processors and context machinery too) and retries with backoff for up to its
timeout in the calling thread, whereas this is one mapping from rows we already have, a
thread and a POST. See docs/observability.md, "Export over OTLP".

Guarantees: the caller only appends to a bounded in-memory buffer (never I/O, never an
exception); one daemon thread per process sends batches with a timeout; a failed POST is
logged as a warning and its spans are dropped (no retry: the database still has them); a
full buffer drops new spans (counted in the next warning). At process exit the buffer is
flushed, for at most 5 s. With no endpoint configured, ``exporter()`` is ``None``:
no thread, and the protobuf modules are never imported.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from django.conf import settings

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    from apps.observability.models import Span

logger = logging.getLogger(__name__)

# Spans per request (the SDK's OTEL_BSP_MAX_EXPORT_BATCH_SIZE default).
BATCH = 512
# Spans held while the collector is slow or down; more are dropped.
MAX_QUEUE = 8192
# How long the first span of a batch waits for others to join it.
DELAY_SECONDS = 1.0
SCOPE = "graphene"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_INT64 = (-(2**63), 2**63 - 1)


class SpanData(NamedTuple):
    """A committed span, as the recorder wrote it (hex ids, aware datetimes)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    started_at: datetime
    ended_at: datetime
    status: str  # SpanStatus value: "unset", "ok", "error"
    status_message: str
    attributes: Mapping[str, Any]
    record_id: Any = None
    run_id: Any = None

    @classmethod
    def of(cls, span: Span) -> SpanData:
        return cls(
            span.trace_id,
            span.span_id,
            span.parent_span_id,
            span.name,
            span.started_at,
            span.ended_at,
            str(span.status),
            span.status_message,
            span.attributes,
            span.record_id,
            span.run_id,
        )


@dataclass(frozen=True)
class Config:
    url: str
    headers: dict[str, str]
    service_name: str
    timeout: float


def config_from(variables: Mapping[str, str]) -> Config | None:
    """The exporter's configuration from the standard variables, or None when export is off.

    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is used as is; ``OTEL_EXPORTER_OTLP_ENDPOINT`` is a
    base URL that gets ``/v1/traces`` appended (the OTLP/HTTP convention). Headers are
    ``k=v,k2=v2`` with URL-encoded values; the timeout is in milliseconds (default 10 s).
    """
    url = variables.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if not url:
        base = variables.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        if not base:
            return None
        url = base.rstrip("/") + "/v1/traces"
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        logger.warning("OTLP export is off: %r is not an http(s) URL", url)
        return None
    headers: dict[str, str] = {}
    for item in variables.get("OTEL_EXPORTER_OTLP_HEADERS", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            headers[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
        elif item.strip():
            logger.warning("OTEL_EXPORTER_OTLP_HEADERS: ignored %r (not key=value)", item.strip()[:40])
    try:
        timeout = int(variables.get("OTEL_EXPORTER_OTLP_TIMEOUT", "") or 10_000) / 1000
    except ValueError:
        timeout = 10.0
    service_name = variables.get("OTEL_SERVICE_NAME", "").strip() or "graphene"
    return Config(url=url, headers=headers, service_name=service_name, timeout=max(timeout, 0.1))


# --- the mapping ---------------------------------------------------------------------------


def _nanos(value: datetime) -> int:
    # Exact integer arithmetic: a float timestamp loses the microseconds at today's epoch.
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // timedelta(microseconds=1) * 1000


def _attribute(key: str, value: Any) -> KeyValue:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    if isinstance(value, bool):  # before int: bool is an int
        any_value = AnyValue(bool_value=value)
    elif isinstance(value, int) and _INT64[0] <= value <= _INT64[1]:
        any_value = AnyValue(int_value=value)
    elif isinstance(value, float):
        any_value = AnyValue(double_value=value)
    elif isinstance(value, str):
        any_value = AnyValue(string_value=value)
    else:  # None, lists, objects, huge ints: a JSON string keeps them readable
        any_value = AnyValue(string_value=json.dumps(value, default=str, sort_keys=True))
    return KeyValue(key=key, value=any_value)


def encode(spans: Iterable[SpanData], *, service_name: str) -> ExportTraceServiceRequest:
    """One OTLP request: one resource (``service.name``), one scope, the spans."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Status
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan

    codes = {"ok": Status.STATUS_CODE_OK, "error": Status.STATUS_CODE_ERROR}
    out = []
    for span in spans:
        attributes = dict(span.attributes or {})
        if span.record_id is not None:
            attributes.setdefault("graphene.record.id", str(span.record_id))
        if span.run_id is not None:
            attributes.setdefault("graphene.run.id", str(span.run_id))
        code = codes.get(span.status, Status.STATUS_CODE_UNSET)
        out.append(
            OtlpSpan(
                trace_id=bytes.fromhex(span.trace_id),
                span_id=bytes.fromhex(span.span_id),
                parent_span_id=bytes.fromhex(span.parent_span_id) if span.parent_span_id else b"",
                name=span.name,
                kind=OtlpSpan.SPAN_KIND_INTERNAL,
                start_time_unix_nano=_nanos(span.started_at),
                end_time_unix_nano=_nanos(span.ended_at),
                attributes=[_attribute(str(k), v) for k, v in attributes.items()],
                # OTLP: the message is only meaningful (and only kept) with an error.
                status=Status(code=code, message=span.status_message if code == Status.STATUS_CODE_ERROR else ""),
            )
        )
    resource = Resource(attributes=[_attribute("service.name", service_name)])
    scope = ScopeSpans(scope=InstrumentationScope(name=SCOPE), spans=out)
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(resource=resource, scope_spans=[scope])])


# --- the exporter ---------------------------------------------------------------------------


class Exporter:
    """A bounded buffer and the daemon thread that posts it to the collector in batches."""

    def __init__(self, config: Config, *, batch: int = BATCH, max_queue: int = MAX_QUEUE) -> None:
        self.config = config
        self.batch = batch
        self.max_queue = max_queue
        self._buffer: list[SpanData] = []
        self._dropped = 0
        self._stopping = False
        self._cond = threading.Condition()
        self._pid = os.getpid()
        # Proxies from the environment are honoured, as the SDK's exporter (requests) does.
        self._opener = urllib.request.build_opener()
        self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._thread.start()

    def export(self, spans: Iterable[SpanData]) -> None:
        """Queue spans for export: no I/O, never raises, drops what does not fit."""
        try:
            with self._cond:
                if self._stopping:
                    return
                room = self.max_queue - len(self._buffer)
                spans = list(spans)
                self._buffer.extend(spans[: max(room, 0)])
                self._dropped += max(len(spans) - max(room, 0), 0)
                self._cond.notify()
        except Exception:  # telemetry never fails the work it describes
            logger.warning("OTLP export: could not queue spans", exc_info=True)

    def shutdown(self, timeout: float | None = None) -> None:
        """Send what is buffered and stop the thread, waiting at most ``timeout`` (default: the
        request timeout, at most 5 s, so that a hanging collector never holds up an exit)."""
        if os.getpid() != self._pid:  # a forked child's copy: the thread is the parent's
            return
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(min(self.config.timeout, 5.0) if timeout is None else timeout)

    def _take(self) -> tuple[list[SpanData], int, bool]:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._buffer) or self._stopping)
            # Let a batch fill up for a moment: spans arrive in bursts (a flush of an execution).
            self._cond.wait_for(lambda: len(self._buffer) >= self.batch or self._stopping, timeout=DELAY_SECONDS)
            spans, self._buffer = self._buffer[: self.batch], self._buffer[self.batch :]
            dropped, self._dropped = self._dropped, 0
            return spans, dropped, self._stopping and not self._buffer

    def _run(self) -> None:
        while True:
            try:
                spans, dropped, last = self._take()
                if dropped:
                    logger.warning("OTLP export: buffer full (%d spans), dropped %d span(s)", self.max_queue, dropped)
                if spans:
                    self._send(spans)
                if last:
                    return
            except Exception:  # keep the thread alive whatever one batch did
                logger.warning("OTLP export: a batch failed", exc_info=True)

    def _send(self, spans: list[SpanData]) -> None:
        body = encode(spans, service_name=self.config.service_name).SerializeToString()
        request = urllib.request.Request(  # noqa: S310 - the scheme was checked in config_from
            self.config.url,
            data=body,
            method="POST",
            headers={**self.config.headers, "Content-Type": "application/x-protobuf"},
        )
        try:
            with self._opener.open(request, timeout=self.config.timeout) as response:
                response.read()
        except Exception as exc:  # HTTPError, URLError, timeouts, resets: drop, never retry
            # The URL, never the headers: they usually carry the collector's API key.
            logger.warning("OTLP export to %s failed, %d span(s) dropped: %s", self.config.url, len(spans), exc)


# --- the process's exporter -----------------------------------------------------------------

_lock = threading.Lock()
_state: list[Exporter | None] = []  # empty: not configured yet in this process


def exporter() -> Exporter | None:
    """This process's exporter, started on first use; None when export is off (the common case:
    one list read)."""
    if _state:
        return _state[0]
    with _lock:
        if not _state:
            instance = None
            try:
                config = config_from(getattr(settings, "GRAPHENE_OTLP_ENV", {}))
                if config is not None:
                    instance = Exporter(config)
                    _at_exit(instance)
            except Exception:  # telemetry never fails the work it describes
                logger.warning("OTLP export is off: the exporter could not start", exc_info=True)
            _state.append(instance)
        return _state[0]


def _at_exit(instance: Exporter) -> None:
    atexit.register(instance.shutdown)
    # Celery's prefork children leave through os._exit, which skips atexit; the signal is sent
    # in the child just before. Celery is already imported wherever it applies.
    if "celery" in sys.modules:
        from celery.signals import worker_process_shutdown

        worker_process_shutdown.connect(lambda **_: instance.shutdown(), weak=False)


def export(spans: Iterable[SpanData]) -> None:
    """Queue spans for export if export is on (no-op otherwise)."""
    current = exporter()
    if current is not None:
        current.export(spans)


def reset() -> None:
    """Forget this process's exporter (stopping it): the next use reads the settings again."""
    with _lock:
        current = _state.pop() if _state else None
    if current is not None:
        current.shutdown()


def _after_fork() -> None:
    # Threads do not survive fork: a forked child (a Celery pool process) starts its own.
    global _lock
    _lock = threading.Lock()
    _state.clear()


os.register_at_fork(after_in_child=_after_fork)
