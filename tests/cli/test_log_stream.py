"""Live logs as server-sent events (``GET /api/v1/records/{id}/logs/stream/``) from a real server.

The embedded server of the CLI tests (daphne, ASGI) serves the stream; a run of the ``hello``
example writes the lines while the test reads them off the socket.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from typing import Any

import pytest

from tests.harness.embedded import Server

pytestmark = pytest.mark.xdist_group("graphene-up")  # the CLI tests' embedded server

DEADLINE = 30.0


class EventStream:
    """A raw HTTP connection reading ``text/event-stream`` frames as they arrive."""

    def __init__(self, server: Server, path: str, headers: dict[str, str] | None = None) -> None:
        url = urllib.parse.urlsplit(server.url)
        self.conn = http.client.HTTPSConnection(
            url.hostname or "127.0.0.1", url.port, timeout=DEADLINE, context=server.context
        )
        self.conn.request(
            "GET",
            f"/api/v1/{path}",
            headers={"Accept": "text/event-stream", "Authorization": f"Token {server.token}", **(headers or {})},
        )
        self.response = self.conn.getresponse()

    def events(self, until: Any) -> list[dict[str, str]]:
        """Frames (as field dicts) up to and including the first for which ``until`` is true."""
        frames: list[dict[str, str]] = []
        frame: dict[str, str] = {}
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            line = self.response.readline().decode().rstrip("\n")
            if line == "":
                if frame:
                    frames.append(frame)
                    if until(frame):
                        return frames
                frame = {}
            elif not line.startswith(":"):
                key, _, value = line.partition(": ")
                frame[key] = value
        raise AssertionError(f"no matching event within {DEADLINE}s; got {frames}")

    def close(self) -> None:
        self.conn.close()


def _start(server: Server, name: str, pause: float) -> dict[str, Any]:
    status, run = server.api("POST", "pipelines/hello/runs/", {"inputs": {"name": name, "pause_seconds": pause}})
    assert status == 201, run
    return server.get(f"runs/{run['id']}/")


def test_a_run_log_streams_live_and_resumes_after_the_last_event_id(server: Server) -> None:
    run = _start(server, "Stream", 1.0)
    stream = EventStream(server, f"records/{run['record']}/logs/stream/")
    try:
        assert stream.response.status == 200
        assert stream.response.getheader("Content-Type", "").startswith("text/event-stream")
        frames = stream.events(lambda f: "Hello, Stream!" in f.get("data", ""))
    finally:
        stream.close()
    assert frames[0] == {"retry": "2000"}
    lines = [json.loads(f["data"]) for f in frames[1:]]
    assert all(f["event"] == "log" for f in frames[1:])
    assert [int(f["id"]) for f in frames[1:]] == [line["id"] for line in lines]
    stored = server.get(f"records/{run['record']}/logs/?limit=1000")["results"]
    assert lines == stored[: len(lines)], "each line once, in order, as the REST API has it"

    # A reconnecting client (EventSource) sends the last id it saw: it gets only what followed.
    again = EventStream(server, f"records/{run['record']}/logs/stream/", {"Last-Event-ID": str(lines[0]["id"])})
    try:
        resumed = again.events(lambda f: "Hello, Stream!" in f.get("data", ""))
    finally:
        again.close()
    assert [json.loads(f["data"]) for f in resumed[1:]] == lines[1:]

    tail = EventStream(server, f"records/{run['record']}/logs/stream/?tail=1")
    try:
        last = tail.events(lambda f: f.get("event") == "log")
    finally:
        tail.close()
    assert json.loads(last[-1]["data"]) == stored[-1]


def test_bad_stream_requests_get_clear_errors(server: Server) -> None:
    run = _start(server, "Errors", 0)
    for query, field in (("?tail=0", "tail"), ("?after=x", "after"), ("?severity=loud", "severity")):
        stream = EventStream(server, f"records/{run['record']}/logs/stream/{query}")
        try:
            assert stream.response.status == 400, query
            body = json.loads(stream.response.read())
        finally:
            stream.close()
        assert field in json.dumps(body), (query, body)
    missing = EventStream(server, "records/00000000-0000-4000-8000-000000000000/logs/stream/")
    try:
        assert missing.response.status == 404
        assert "no record" in json.loads(missing.response.read())["detail"]
    finally:
        missing.close()
