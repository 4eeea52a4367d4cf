"""What the docker kinds share: the client, labels, errors, spec hashes, logs and metrics."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

import docker
import docker.errors
import requests.exceptions
from django.conf import settings
from django.db import connection

from kinds import Kind, KindError, Marked, PermanentError
from kinds.machine import Purpose

if TYPE_CHECKING:
    from apps.records.models import Record

logger = logging.getLogger("kinds.docker")

# Labels on every object (I4). ``record`` is the marker create adopts by; ``scope`` names the
# installation (see ``scope()``), so that two Graphenes sharing one dockerd never sweep each
# other's objects; ``kind`` tells containers of docker.container from those of docker.job;
# ``spec`` is a hash of the spec the object was made from (a changed spec makes a new object).
LABEL_RECORD = "graphene.record"
LABEL_SCOPE = "graphene.scope"
LABEL_KIND = "graphene.kind"
LABEL_NAME = "graphene.name"
LABEL_SPEC = "graphene.spec"

# Log lines fetched from a container are written with ``source = "docker@<its timestamp>"``:
# the newest such line of a record is where the next fetch continues (durable, no extra state).
LOG_SOURCE_PREFIX = "docker@"
# At most this many lines are written per fetch; an older backlog is summarized in one line.
MAX_LOG_LINES = 5_000
TAIL_LINES = 20
TAIL_CHARS = 4_000

# --- client ------------------------------------------------------------------------------------

_local = threading.local()


def docker_host() -> str:
    return str(settings.GRAPHENE_DOCKER_HOST)


def engine() -> str:
    """The engine being talked to, for messages: the server's dockerd or an agent's."""
    from kinds.docker import _agent

    target = _agent.current()
    return f"the engine on agent {target.agent_id}" if target is not None else f"dockerd at {docker_host()}"


def client() -> docker.DockerClient:
    """A client for ``GRAPHENE_DOCKER_HOST``, one per thread and process (requests sessions
    are not shared across threads; a forked worker must not reuse its parent's sockets).

    Within ``on_engine`` for a record whose spec names an ``agent``: the engine on that
    agent's machine, reached through the agent (``kinds.docker._agent``)."""
    from kinds.docker import _agent

    target = _agent.current()
    if target is not None:
        with translate_errors("connect"):
            return _agent.agent_client(target.agent_id)
    key = (os.getpid(), docker_host())
    cached = getattr(_local, "client", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    with translate_errors("connect"):
        made = docker.DockerClient(base_url=docker_host(), timeout=60)
    _local.client = (key, made)
    return made


def _status(exc: docker.errors.APIError) -> int:
    code = exc.status_code
    return int(code) if code is not None else 0


@contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Docker and transport errors as kind errors: permanent for a refused request (400),
    retryable for the rest (conflicts, busy objects, daemon unreachable or failing).

    ``NotFound`` passes through: callers decide whether "gone" is success or a failure.
    """
    try:
        yield
    except docker.errors.NotFound:
        raise
    except docker.errors.APIError as exc:
        detail = exc.explanation or str(exc)
        if _status(exc) == 400:
            raise PermanentError(f"docker refused to {what}: {detail}") from exc
        raise KindError(f"docker could not {what}: {detail}") from exc
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise KindError(f"cannot {what}: {engine()} did not answer: {exc}") from exc


def is_conflict(exc: docker.errors.APIError) -> bool:
    return _status(exc) == 409


def claim(record: Record, obj: Any, what: str) -> Any:
    """``obj`` if it carries the record's marker (ours: adopt it); a stranger's is never taken."""
    attrs = obj.attrs
    labels = (attrs.get("Labels") or (attrs.get("Config") or {}).get("Labels")) or {}
    owner = labels.get(LABEL_RECORD)
    if owner != str(record.pk):
        whose = f"record {owner}" if owner else "no Graphene record"
        raise PermanentError(f"{what} already exists and belongs to {whose}; refusing to adopt it")
    return obj


def scope() -> str:
    """The installation's scope label: ``GRAPHENE_DOCKER_SCOPE`` or a digest of its database.

    Everything sharing one database (web, workers, beat) is one installation; a test session
    has its own database, so concurrent test sessions on one dockerd stay apart too.
    """
    configured = settings.GRAPHENE_DOCKER_SCOPE
    if configured:
        return str(configured)
    db = connection.settings_dict
    identity = f"{connection.vendor}:{db.get('HOST') or ''}:{db.get('PORT') or ''}:{db.get('NAME')}"
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def labels_for(record: Record, kind: str, spec_hash: str | None = None) -> dict[str, str]:
    labels = {
        LABEL_RECORD: str(record.pk),
        LABEL_SCOPE: scope(),
        LABEL_KIND: kind,
        LABEL_NAME: record.name[:200],
    }
    if spec_hash is not None:
        labels[LABEL_SPEC] = spec_hash
    return labels


def record_filter(record: Record) -> dict[str, Any]:
    return {"label": [f"{LABEL_RECORD}={record.pk}"]}


def sweep_filter(kind: str) -> dict[str, Any]:
    return {"label": [f"{LABEL_SCOPE}={scope()}", f"{LABEL_KIND}={kind}"]}


def spec_hash(spec: Mapping[str, Any], ignore: frozenset[str] = frozenset()) -> str:
    """A digest of the spec fields that shape the object (secret references by name, I7)."""
    shaping = {key: value for key, value in spec.items() if key not in ignore}
    return hashlib.sha256(json.dumps(shaping, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def deletion_requested(record: Record) -> bool:
    """Whether the record's deletion began (a wait in ``create`` gives up: the delete waits for it)."""
    from apps.records.selectors import record_deletion_requested

    return record_deletion_requested(record_id=record.pk)


def wait_until(
    condition: Callable[[], Any], *, timeout: float, record: Record, what: str, interval: float = 0.25
) -> Any:
    """Poll ``condition`` until it returns something truthy; ``KindError`` at the deadline or
    as soon as the record's deletion is requested (so the delete does not wait for us)."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        value = condition()
        if value:
            return value
        if deletion_requested(record):
            raise KindError(f"gave up waiting for {what}: the record is being deleted")
        if time.monotonic() >= deadline:
            raise KindError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, interval)


class DockerKind(Kind):
    """Base of the docker kinds: drift is checked every 30 s (objects change behind our back)."""

    drift_interval: ClassVar[timedelta | None] = timedelta(seconds=30)
    # An object given to another engine is removed from the first one (see Kind.placement).
    placement: ClassVar[tuple[str, ...]] = ("agent",)


# Where the object lives: absent, the server's dockerd; else an agent's machine (its record id).
AGENT_PROPERTY: dict[str, Any] = {
    "type": "string",
    "format": "uuid",
    "description": "the agent record whose machine's Docker engine holds the object (absent: the server's)",
}

_M = TypeVar("_M", bound=Callable[..., Any])


def on_engine(mode: Purpose) -> Callable[[_M], _M]:
    """Run a kind's ``create``/``observe``/``delete`` (``mode``) against the record's engine:
    the server's, or its agent's machine's when the spec names an ``agent``."""
    from kinds.docker import _agent

    def wrap(method: _M) -> _M:
        @functools.wraps(method)
        def run(self: Any, record: Record, *args: Any, **kwargs: Any) -> Any:
            with _agent.on_agent(record, mode):
                return method(self, record, *args, **kwargs)
            return None  # a deletion given up on (the machine is gone): recorded by on_agent

        return cast(_M, run)

    return wrap


def sweep_marked(objects: list[Any], *, id_of: Callable[[Any], str]) -> Iterator[Marked]:
    for obj in objects:
        labels = (obj.attrs.get("Labels") or obj.attrs.get("Config", {}).get("Labels")) or {}
        record_id = labels.get(LABEL_RECORD)
        if record_id:
            yield Marked(external_id=id_of(obj), record_id=record_id)


def list_or_nothing(kind: str, lister: Callable[[], list[Any]]) -> list[Any]:
    """For ``sweep``: the orphan sweeper walks every kind in one pass, and an unreachable
    dockerd must not stop it from sweeping the others. The next sweep finds what this missed."""
    try:
        with translate_errors(f"list {kind} objects"):
            return lister()
    except KindError as exc:
        logger.warning("orphan sweep skipped %s: %s", kind, exc)
        return []


# --- logs --------------------------------------------------------------------------------------

_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z$")


def parse_ts(value: str) -> int | None:
    """Docker's RFC 3339 timestamp (trailing zeros of the fraction trimmed) as nanoseconds."""
    match = _TS.match(value)
    if match is None:
        return None
    seconds = int(datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp())
    return seconds * 1_000_000_000 + int((match.group(2) or "0").ljust(9, "0"))


def _split(raw: bytes, stream: str) -> list[tuple[int, str, str, str]]:
    """``(ns, stamp, stream, text)`` for each line of a ``timestamps=True`` log answer."""
    out = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        stamp, _, text = line.partition(" ")
        ns = parse_ts(stamp)
        if ns is not None:
            out.append((ns, stamp, stream, text))
    return out


def _cursor(record: Record) -> tuple[int, str] | None:
    from apps.observability.selectors import log_lines

    source = (
        log_lines(record=record, include_descendants=False)
        .filter(source__startswith=LOG_SOURCE_PREFIX)
        .order_by("-id")
        .values_list("source", flat=True)
        .first()
    )
    if not source:
        return None
    stamp = source[len(LOG_SOURCE_PREFIX) :]
    ns = parse_ts(stamp)
    return (ns, stamp) if ns is not None else None


def _write_lines(record: Record, lines: list[tuple[str, str, str, str]]) -> None:
    """Write ``(message, stream, severity, source)`` lines to the record's log, in one statement."""
    from apps.observability.services import LogEntry, log_write_many

    log_write_many(
        LogEntry(record_id=record.pk, message=message, stream=stream, severity=severity, source=source)
        for message, stream, severity, source in lines
    )


def printed_secrets(record: Record) -> list[str]:
    """The secrets' values the record's container was given (its ``env``'s references): what
    it prints is stored with them masked (I7)."""
    from apps.secrets.services import secret_refs_values

    return secret_refs_values(record.spec.get("env") or {}, namespace=record.namespace)


def masked(text: str, secrets: list[str], *, is_tail: bool = False) -> str:
    from apps.secrets.services import secrets_mask

    return secrets_mask(text, values=secrets, is_tail=is_tail) if secrets else text


def sync_logs(record: Record, container: Any) -> int:
    """Append the container's output since the last line already written to the record's log.

    Lines are fetched with Docker's timestamps; the newest written line's timestamp (kept in
    its ``source``) is the cursor, so a repeated call (a retried create, two observations)
    never writes a line twice. Returns how many lines were written.
    """
    cursor = _cursor(record)
    since = max(cursor[0] // 1_000_000_000 - 1, 1) if cursor else None
    lines: list[tuple[int, str, str, str]] = []
    with translate_errors(f"read the logs of container {container.name}"):
        for stream in ("stdout", "stderr"):
            raw = container.logs(
                stdout=stream == "stdout",
                stderr=stream == "stderr",
                timestamps=True,
                since=since,
                tail=MAX_LOG_LINES + 1,
            )
            lines.extend(_split(raw, stream))
    if cursor is not None:
        lines = [line for line in lines if line[0] > cursor[0]]
    if not lines:
        return 0
    lines.sort(key=lambda line: line[0])
    out: list[tuple[str, str, str, str]] = []
    if len(lines) > MAX_LOG_LINES:
        skipped = len(lines) - MAX_LOG_LINES
        lines = lines[skipped:]
        out.append((f"[graphene] {skipped}+ older lines of {container.name} were not copied", "stderr", "warning", ""))
    secrets = printed_secrets(record)
    out.extend(
        (masked(text, secrets), stream, "info", f"{LOG_SOURCE_PREFIX}{stamp}") for _ns, stamp, stream, text in lines
    )
    _write_lines(record, out)
    return len(lines)


def sync_logs_quietly(record: Record, container: Any) -> None:
    """``sync_logs`` where logs are a by-product (observation, deletion): never fail for them."""
    try:
        sync_logs(record, container)
    except Exception:
        logger.warning("could not copy the logs of %s for record %s", container.name, record.pk, exc_info=True)


def tail(container: Any, *, stdout: bool = True, stderr: bool = True, lines: int = TAIL_LINES) -> str:
    with translate_errors(f"read the logs of container {container.name}"):
        raw: bytes = container.logs(stdout=stdout, stderr=stderr, tail=lines)
    text = raw.decode("utf-8", errors="replace").rstrip("\n")
    return text[-TAIL_CHARS:]


def log_tail(record: Record, *, stream: str | None = None, lines: int = TAIL_LINES) -> str:
    """The last lines copied from the record's container(s) into its log (one stream, or both).

    Read from the log rather than from dockerd: Docker's ``tail`` counts the lines of both
    streams before it filters one out, so a stdout tail from it comes up short.
    """
    from apps.observability.selectors import log_lines

    copied = log_lines(record=record, include_descendants=False).filter(source__startswith=LOG_SOURCE_PREFIX)
    if stream is not None:
        copied = copied.filter(stream=stream)
    messages = list(copied.order_by("-id").values_list("message", flat=True)[:lines])
    return "\n".join(reversed(messages))[-TAIL_CHARS:]


# --- metrics -----------------------------------------------------------------------------------


def record_stats(record: Record, container: Any) -> None:
    """Write the container's CPU time and memory use as metric points of the record."""
    try:
        from apps.observability.services import Sample, metric_write_many
    except ImportError:  # an installation without per-record metrics
        return
    try:
        with translate_errors(f"read the stats of container {container.name}"):
            try:
                stats = container.stats(stream=False, one_shot=True)
            except docker.errors.InvalidVersion:  # API < 1.41: one sample takes ~1 s more
                stats = container.stats(stream=False)
        cpu_ns = (stats.get("cpu_stats") or {}).get("cpu_usage", {}).get("total_usage")
        memory = stats.get("memory_stats") or {}
        detail = memory.get("stats") or {}
        # What `docker stats` shows: usage without the page cache that could be dropped.
        cache = detail.get("inactive_file", detail.get("total_inactive_file", detail.get("cache", 0)))
        samples = []
        if cpu_ns is not None:
            samples.append(Sample(record.pk, "container_cpu_seconds_total", cpu_ns / 1e9))
        if memory.get("usage") is not None:
            samples.append(Sample(record.pk, "container_memory_bytes", max(memory["usage"] - cache, 0)))
        if memory.get("limit"):
            samples.append(Sample(record.pk, "container_memory_limit_bytes", memory["limit"]))
        if samples:
            metric_write_many(samples=samples)
    except Exception:
        logger.warning("could not record the stats of %s for record %s", container.name, record.pk, exc_info=True)
