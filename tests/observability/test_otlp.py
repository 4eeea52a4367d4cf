"""Spans exported over OTLP/HTTP to a real receiver: a loopback HTTP server that parses every
body with opentelemetry-proto's ``ExportTraceServiceRequest``, as a collector would."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from apps.observability import otlp
from apps.observability.tracing import run_span_id
from apps.pipelines import services
from apps.pipelines.models import Run
from tests.conftest import REPO, Worker, process_env, wait_for
from tests.harness.net import free_port


class Receiver:
    """An OTLP/HTTP trace receiver on a free loopback port (``POST /v1/traces``)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], ExportTraceServiceRequest]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                message = ExportTraceServiceRequest()
                message.ParseFromString(body)
                with receiver._lock:
                    receiver.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, message))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # quiet: no access log on stderr
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list[tuple[dict[str, Any], OtlpSpan]]:
        """(resource attributes, span) for every span received so far."""
        with self._lock:
            requests = list(self.requests)
        return [
            ({kv.key: value_of(kv.value) for kv in rs.resource.attributes}, span)
            for _, _, message in requests
            for rs in message.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def value_of(value: AnyValue) -> Any:
    return getattr(value, value.WhichOneof("value") or "string_value")


def attributes(span: OtlpSpan) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in span.attributes}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.stop()


def finished(run: Run, timeout: float = 90) -> Run:
    ended = {"succeeded", "failed", "cancelled", "timed_out"}
    wait_for(lambda: Run.objects.get(pk=run.pk).status in ended, timeout=timeout, what=f"{run} to end")
    return Run.objects.get(pk=run.pk)


# --- system: real workers export what they record ---------------------------------------------


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_a_workers_spans_reach_an_otlp_receiver(
    start_worker: Callable[..., Worker], receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url + "/")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=k3y,x-tenant=team%20a")
    start_worker()
    run = services.run_start(pipeline_name="sample.step", inputs={})
    failing = services.run_start(pipeline_name="sample.fail", inputs={"retries": 0, "fail_times": 5})
    run, failing = finished(run), finished(failing)
    assert run.status == "succeeded", run.error
    assert failing.status == "failed"

    def trace(of: Run, *names: str) -> dict[str, tuple[dict[str, Any], OtlpSpan]]:
        got = {s.name: (r, s) for r, s in receiver.spans() if s.trace_id == of.pk.bytes}
        return got if set(names) <= set(got) else {}

    root_name = f"run sample.step#{run.number}"
    spans = wait_for(
        lambda: trace(run, root_name, "step act", "step after", "execute #1"),
        timeout=60,
        what="the run's spans at the receiver",
    )
    path, headers, _ = receiver.requests[0]
    assert path == "/v1/traces"
    assert headers["content-type"] == "application/x-protobuf"
    assert headers["x-api-key"] == "k3y"
    assert headers["x-tenant"] == "team a"

    resource, root = spans[root_name]
    assert resource["service.name"] == "graphene"
    assert root.span_id == bytes.fromhex(run_span_id(run.pk))
    assert root.parent_span_id == b""
    assert root.status.code == Status.STATUS_CODE_OK
    assert attributes(root)["graphene.pipeline"] == "sample.step"
    assert attributes(root)["graphene.run.number"] == run.number
    for name in ("step act", "step after", "execute #1"):
        span = spans[name][1]
        assert span.parent_span_id == root.span_id
        assert span.status.code == Status.STATUS_CODE_OK
        assert attributes(span)["graphene.record.id"] == str(run.record_id)
        assert attributes(span)["graphene.run.id"] == str(run.pk)
        assert root.start_time_unix_nano <= span.start_time_unix_nano <= span.end_time_unix_nano
    act = attributes(spans["step act"][1])
    assert act["graphene.step"] == "act"
    assert act["graphene.attempts"] == 1
    assert act["graphene.guarantee"] == "at_least_once"
    assert attributes(spans["execute #1"][1])["graphene.outcome"] == "succeeded"
    # Nanoseconds since the epoch, and the same instants as the stored spans.
    assert run.finished_at is not None
    assert abs(root.end_time_unix_nano / 1e9 - run.finished_at.timestamp()) < 5

    failed = wait_for(
        lambda: trace(failing, f"run sample.fail#{failing.number}", "step flaky", "records.delete_batch"),
        timeout=60,
        what="the failed run's spans at the receiver",
    )
    flaky = failed["step flaky"][1]
    assert flaky.status.code == Status.STATUS_CODE_ERROR
    assert "boom" in flaky.status.message
    root_failed = failed[f"run sample.fail#{failing.number}"][1]
    assert root_failed.status.code == Status.STATUS_CODE_ERROR
    assert flaky.parent_span_id == root_failed.span_id
    # Spans written by other code than the engine (the tree's deletion after the failure).
    batch = failed["records.delete_batch"][1]
    assert batch.parent_span_id == root_failed.span_id
    deleted = [s for _, s in receiver.spans() if s.name == "record.delete" and s.parent_span_id == batch.span_id]
    assert {attributes(s)["graphene.record.id"] for s in deleted} >= {str(failing.record_id)}


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_a_dead_collector_neither_fails_nor_slows_a_run(
    start_worker: Callable[..., Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{free_port()}/v1/traces")
    worker = start_worker()
    run = finished(services.run_start(pipeline_name="sample.step", inputs={}))
    assert run.status == "succeeded", run.error
    assert run.started_at is not None
    assert run.finished_at is not None
    assert run.finished_at - run.started_at < timedelta(seconds=30)
    wait_for(lambda: "OTLP export to" in worker.log.read_text(), timeout=30, what=f"the export warning in {worker.log}")
    assert "span(s) dropped" in worker.log.read_text()


# --- the exporter on its own ----------------------------------------------------------------


def span(name: str = "step x", **attrs: Any) -> otlp.SpanData:
    at = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    return otlp.SpanData(
        trace_id="0af7651916cd43dd8448eb211c80319c",
        span_id="b7ad6b7169203331",
        parent_span_id="00f067aa0ba902b7",
        name=name,
        started_at=at,
        ended_at=at + timedelta(milliseconds=5),
        status="error",
        status_message="Boom: no",
        attributes=attrs,
        record_id="7bf474fa-0000-4000-8000-000000000001",
    )


def test_config_follows_the_standard_variables() -> None:
    assert otlp.config_from({}) is None
    assert otlp.config_from({"OTEL_EXPORTER_OTLP_HEADERS": "a=b"}) is None
    base = otlp.config_from({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"})
    assert base is not None
    assert base.url == "http://collector:4318/v1/traces"
    assert base.service_name == "graphene"
    assert base.timeout == 10.0
    full = otlp.config_from(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://ignored:4318",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://collector/custom/path",
            "OTEL_EXPORTER_OTLP_HEADERS": " api-key = s%3Dcret , bad, x=1",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
            "OTEL_SERVICE_NAME": "graphene-eu",
        }
    )
    assert full == otlp.Config(
        url="https://collector/custom/path",
        headers={"api-key": "s=cret", "x": "1"},
        service_name="graphene-eu",
        timeout=2.5,
    )
    assert otlp.config_from({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"}) is None


def test_spans_map_to_otlp() -> None:
    request = otlp.encode(
        [span(s="v", i=3, f=0.5, b=True, n=None, lst=[1, "a"], obj={"k": 1}, big=2**70)], service_name="svc"
    )
    (resource_spans,) = request.resource_spans
    assert {kv.key: value_of(kv.value) for kv in resource_spans.resource.attributes} == {"service.name": "svc"}
    (out,) = resource_spans.scope_spans[0].spans
    assert out.trace_id == bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
    assert out.span_id == bytes.fromhex("b7ad6b7169203331")
    assert out.parent_span_id == bytes.fromhex("00f067aa0ba902b7")
    assert out.start_time_unix_nano == 1767323045123456000
    assert out.end_time_unix_nano - out.start_time_unix_nano == 5_000_000
    assert out.status.code == Status.STATUS_CODE_ERROR
    assert out.status.message == "Boom: no"
    got = {kv.key: (kv.value.WhichOneof("value"), value_of(kv.value)) for kv in out.attributes}
    assert got == {
        "s": ("string_value", "v"),
        "i": ("int_value", 3),
        "f": ("double_value", 0.5),
        "b": ("bool_value", True),
        "n": ("string_value", "null"),
        "lst": ("string_value", '[1, "a"]'),
        "obj": ("string_value", '{"k": 1}'),
        "big": ("string_value", str(2**70)),
        "graphene.record.id": ("string_value", "7bf474fa-0000-4000-8000-000000000001"),
    }


def test_export_batches_to_the_receiver_and_flushes_on_shutdown(receiver: Receiver) -> None:
    config = otlp.config_from({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
    assert config is not None
    exporter = otlp.Exporter(config, batch=2)
    exporter.export([span("a"), span("b"), span("c")])
    exporter.shutdown(timeout=30)
    assert sorted(s.name for _, s in receiver.spans()) == ["a", "b", "c"]
    assert all(len(m.resource_spans[0].scope_spans[0].spans) <= 2 for _, _, m in receiver.requests)


def test_a_hanging_collector_never_blocks_the_caller(caplog: pytest.LogCaptureFixture) -> None:
    # A socket that listens but never answers: the request hangs until the exporter's timeout.
    with socket.socket() as hanging:
        hanging.bind(("127.0.0.1", 0))
        hanging.listen(16)
        url = f"http://127.0.0.1:{hanging.getsockname()[1]}/v1/traces"
        config = otlp.Config(url=url, headers={}, service_name="graphene", timeout=0.5)
        exporter = otlp.Exporter(config, batch=1, max_queue=3)
        caplog.set_level(logging.WARNING, logger="apps.observability.otlp")
        started = time.monotonic()
        for _ in range(10):
            exporter.export([span(), span()])  # far more than the queue holds: the rest is dropped
        assert time.monotonic() - started < 0.5
        wait_for(lambda: "OTLP export to" in caplog.text, timeout=30, what="the timeout warning")
        exporter.shutdown(timeout=30)
    assert "dropped" in caplog.text


def test_without_an_endpoint_nothing_starts_and_nothing_is_imported() -> None:
    code = (
        "import sys, threading, django; django.setup();"
        "from apps.observability import otlp, tracing;"
        "assert otlp.exporter() is None;"
        "assert not [t for t in threading.enumerate() if t.name == 'otlp-export'];"
        "assert not [m for m in sys.modules if m.startswith(('opentelemetry', 'google.protobuf'))], 'imported'"
    )
    env = {k: v for k, v in process_env().items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
