"""The ``Client``'s nouns: ``records``, ``logs``, ``runs``, ``stands`` and ``artifacts``.

Each is a small class over the transport; listings return ``Paged`` (an iterator over every
item that fetches cursor pages as it goes, or ``.pages()``). Listings of what lives in a
namespace take ``namespace=``: the client's (``Client(namespace=)``, ``GRAPHENE_NAMESPACE``,
the context's) when not given, ``"*"`` for every namespace the caller may see.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import io
import json
import os
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import IO, Any, Literal

from graphene_sdk._errors import ClientError, ConfigError
from graphene_sdk._http import CHUNK, EventStream, Paged, Params, Transport
from graphene_sdk._models import (
    ArtifactInfo,
    LogLine,
    RecordEvent,
    RecordInfo,
    RunEvent,
    RunInfo,
    StandInfo,
    StandSummary,
    TreeNode,
)

# How long ``logs.follow`` rides out a server that cannot be reached before it raises.
FOLLOW_OUTAGE_SECONDS = 60.0

Severity = Literal["debug", "info", "warning", "error"]
Labels = Mapping[str, str] | Iterable[str]


def _labels(labels: Labels | None) -> list[str]:
    """A label selector as the API takes it: ``k=v`` terms, all of which must match."""
    if labels is None:
        return []
    if isinstance(labels, Mapping):
        return [f"{k}={v}" for k, v in labels.items()]
    if isinstance(labels, str):
        labels = [labels]
    terms = [term.strip() for value in labels for term in value.split(",") if term.strip()]
    for term in terms:
        if "=" not in term:
            raise ValueError(f"label selector {term!r} must look like key=value")
    return terms


def _csv(values: str | Iterable[str] | None) -> str | None:
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    return ",".join(v.strip() for value in values for v in value.split(",") if v.strip()) or None


def _namespace(default: str | None, given: str | None) -> str | None:
    """The namespace a listing narrows to: ``given`` (``"*"``: none, every namespace the caller
    may see), else the client's ``default``; ``ValueError`` for a name no namespace can have."""
    from graphene_sdk import config

    if given is None:
        return default
    try:
        return config.normalize_namespace(config.check_namespace(given, source="namespace"))
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


def _when(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


def _seconds(value: timedelta | float | None) -> int | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    return max(int(seconds), 1)


class Records:
    """Records: list with selectors, get, tree, events."""

    def __init__(self, transport: Transport, *, namespace: str | None = None) -> None:
        self._t = transport
        self._namespace = namespace

    def list(
        self,
        *,
        kind: str | None = None,
        phase: str | Iterable[str] | None = None,
        owner: str | None = None,
        labels: Labels | None = None,
        name_prefix: str | None = None,
        include_deleted: bool = False,
        namespace: str | None = None,
        page_size: int = 100,
    ) -> Paged[RecordInfo]:
        """Records newest first. ``phase``: one or more phases; ``owner``: a record id (its
        direct children); ``labels``: ``{"team": "ci"}`` or ``["team=ci"]``, all must match;
        ``namespace``: the client's if not given, ``"*"`` for every one you may see.
        Deleted records (tombstones) are left out unless ``include_deleted`` or a ``phase``
        asks for them, as in ``graphenectl get records``."""
        phases = _csv(phase)
        params: Params = {
            "kind": kind,
            "phase": phases,
            "owner": owner,
            "label": _labels(labels),
            "name_prefix": name_prefix,
            "namespace": _namespace(self._namespace, namespace),
        }
        alive = None if phases or include_deleted else (lambda r: r.phase != "deleted")
        return Paged(self._t, "records/", params, RecordInfo.from_api, page_size=page_size, keep=alive)

    def get(self, record_id: str) -> RecordInfo:
        """One record, with its owner chain and the counts of what it owns."""
        return RecordInfo.from_api(self._t.get(f"records/{record_id}/"))

    def tree(self, record_id: str, *, depth: int = 3) -> TreeNode:
        """The subtree the record owns, ``depth`` levels below it (0-10)."""
        return TreeNode.from_api(self._t.get(f"records/{record_id}/tree/", {"depth": depth}))

    def events(self, record_id: str, *, page_size: int = 100) -> Paged[RecordEvent]:
        """The record's history, oldest first."""
        return Paged(self._t, f"records/{record_id}/events/", {}, RecordEvent.from_api, page_size=page_size)


LogSource = str | RecordInfo | RunInfo


def _log_record(of: LogSource) -> str:
    """The record whose log to read: a record id, a record, or a run (its root record)."""
    if isinstance(of, RecordInfo):
        return of.id
    if isinstance(of, RunInfo):
        if of.record is None:
            raise ClientError(f"run {of.id} has no record yet; try again in a moment", status=409, code="conflict")
        return of.record
    return of


class Logs:
    """A record's log lines (by default with those of everything it owns): all of them, the
    last N, or followed live. ``of``: a record id, a ``RecordInfo``, or a ``RunInfo`` (the
    run's log: its root record's, with the lines of everything it owns)."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    @staticmethod
    def _filters(
        grep: str | None,
        severity: Severity | None,
        since: datetime | str | None,
        until: datetime | str | None,
        descendants: bool,
    ) -> dict[str, Any]:
        return {
            "grep": grep,
            "severity": severity,
            "since": _when(since),
            "until": _when(until),
            "descendants": None if descendants else "false",
        }

    def list(
        self,
        of: LogSource,
        *,
        grep: str | None = None,
        severity: Severity | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        descendants: bool = True,
        page_size: int = 500,
    ) -> Paged[LogLine]:
        """Every line, oldest first. ``grep``: lines containing the text (any case);
        ``severity``: at least this one; ``since``/``until``: a time window."""
        record_id = _log_record(of)
        params = self._filters(grep, severity, since, until, descendants)
        return Paged(self._t, f"records/{record_id}/logs/", params, LogLine.from_api, page_size=page_size)

    def tail(
        self,
        of: LogSource,
        lines: int = 100,
        *,
        grep: str | None = None,
        severity: Severity | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        descendants: bool = True,
    ) -> builtins.list[LogLine]:
        """The last ``lines`` lines (1-10000), oldest first."""
        record_id = _log_record(of)
        params = {**self._filters(grep, severity, since, until, descendants), "tail": lines}
        body = self._t.get(f"records/{record_id}/logs/", params)
        return [LogLine.from_api(item) for item in body.get("results", [])]

    def follow(
        self,
        of: LogSource,
        *,
        tail: int | None = None,
        after: int | None = None,
        grep: str | None = None,
        severity: Severity | None = None,
        descendants: bool = True,
        check_every: float = 1.0,
    ) -> Generator[LogLine, None, None]:
        """Lines as they are written, over the server's event stream (reconnecting after a
        dropped connection, or a server restart of up to a minute, without losing or repeating
        a line). It starts with the first line, the last ``tail`` lines, or after line id
        ``after``.

        For a run's record it ends once the run has ended and its last line was yielded; for
        another record, once the record is deleted. Stop earlier by leaving the loop (or
        ``close()`` on the iterator); the connection is closed either way. ``check_every``:
        seconds between looks at whether the run (or record) has ended."""
        record_id = _log_record(of)
        record = RecordInfo.from_api(self._t.get(f"records/{record_id}/"))
        filters = self._filters(grep, severity, None, None, descendants)
        params = {**filters, "tail": tail, "after": after}
        stream = EventStream(self._t, f"records/{record_id}/logs/stream/", params)
        last_id = after or 0
        try:
            ended = self._ended_check(record)
            failing_since: float | None = None
            next_check = time.monotonic() + check_every
            while True:
                event = stream.get(timeout=next_check - time.monotonic())
                if event is not None:
                    line = self._line(event.event, event.data)
                    if line is not None and line.id > last_id:
                        last_id = line.id
                        yield line
                if time.monotonic() >= next_check:
                    try:
                        if ended():
                            break
                        failing_since = None
                    except ClientError as exc:
                        # A server restarting: the stream reconnects by itself; give up only
                        # once the server has been unreachable (or failing) for a while.
                        if exc.status != 0 and exc.status < 500:
                            raise
                        failing_since = failing_since or time.monotonic()
                        if time.monotonic() - failing_since > FOLLOW_OUTAGE_SECONDS:
                            raise
                    next_check = time.monotonic() + check_every
            # Ended: what was written before the end may still be on its way. The newest line
            # (as filtered) is where to stop.
            newest = self._t.get(f"records/{record_id}/logs/", {**filters, "tail": 1}).get("results") or []
            last_wanted = int(newest[-1]["id"]) if newest else 0
            deadline = time.monotonic() + 30
            while last_id < last_wanted:
                if time.monotonic() > deadline:
                    raise ClientError(
                        f"the log stream of record {record_id} stopped before line {last_wanted} "
                        f"(the last one read is {last_id}); read the rest with logs.list()",
                        status=0,
                        code="stream_incomplete",
                    )
                event = stream.get(timeout=0.5)
                line = self._line(event.event, event.data) if event is not None else None
                if line is not None and line.id > last_id:
                    last_id = line.id
                    yield line
        finally:
            stream.close()

    @staticmethod
    def _line(event: str, data: str) -> LogLine | None:
        if event not in ("log", "message"):
            return None  # an event type this client does not know: not a line
        try:
            return LogLine.from_api(json.loads(data))
        except (ValueError, KeyError, TypeError):
            return None

    def _ended_check(self, record: RecordInfo) -> Callable[[], bool]:
        """A function answering whether following ``record`` is over."""
        if record.kind == "graphene.run":
            # A run's id is its first root record's; a resumed run's new root names it in its spec.
            run_id = str(record.spec.get("run") or record.id)

            def run_ended() -> bool:
                return RunInfo.from_api(self._t.get(f"runs/{run_id}/")).done

            return run_ended

        def record_gone() -> bool:
            return RecordInfo.from_api(self._t.get(f"records/{record.id}/")).phase == "deleted"

        return record_gone


class Runs:
    """Runs: list, get, status history, cancel, resume, watch, wait."""

    def __init__(self, transport: Transport, *, namespace: str | None = None) -> None:
        self._t = transport
        self._namespace = namespace

    def list(
        self,
        *,
        pipeline: str | None = None,
        status: str | Iterable[str] | None = None,
        parent: str | None = None,
        namespace: str | None = None,
        page_size: int = 100,
    ) -> Paged[RunInfo]:
        """Runs newest first: of one pipeline, in some statuses, started by run ``parent``, in
        ``namespace`` (the client's if not given, ``"*"`` for every one you may see)."""
        params: Params = {
            "pipeline": pipeline,
            "status": _csv(status),
            "parent": parent,
            "namespace": _namespace(self._namespace, namespace),
        }
        return Paged(self._t, "runs/", params, RunInfo.from_api, page_size=page_size)

    def get(self, run_id: str) -> RunInfo:
        """The run with its journal."""
        return RunInfo.from_api(self._t.get(f"runs/{run_id}/"))

    def events(self, run_id: str, *, page_size: int = 100) -> Paged[RunEvent]:
        """The run's status history, oldest first."""
        return Paged(self._t, f"runs/{run_id}/events/", {}, RunEvent.from_api, page_size=page_size)

    def cancel(self, run_id: str) -> RunInfo:
        """Cancel the run: it ends now and everything it owns is deleted, children first."""
        return RunInfo.from_api(self._t.post(f"runs/{run_id}/cancel/"))

    def resume(self, run_id: str) -> RunInfo:
        """Run an ended run again by replay: nothing journaled is redone (409 if it succeeded)."""
        return RunInfo.from_api(self._t.post(f"runs/{run_id}/resume/"))

    def watch(
        self, run_id: str, *, interval: float = 0.5, timeout: float | None = None
    ) -> Generator[RunEvent, None, None]:
        """The run's status moves as they happen, from its first; ends after the move that
        ends the run (``event.is_final``). ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        url = self._t.url(f"runs/{run_id}/events/", {"limit": 500})
        last: RunEvent | None = None
        while True:
            body = self._t.get(url)
            for item in body.get("results", []):
                event = RunEvent.from_api(item)
                if last is None or event.id > last.id:
                    last = event
                    yield event
            if body.get("next"):
                url = body["next"]  # a full page: the next one is there now
                continue
            # The newest move ends the run: it has ended (a resumed run moves on past it).
            if last is not None and last.is_final:
                return
            if deadline is not None and time.monotonic() > deadline:
                status = last.to_status if last else "unknown"
                raise TimeoutError(f"run {run_id} still {status} after {timeout}s")
            time.sleep(interval)

    def wait(self, run_id: str, *, timeout: float = 600.0) -> RunInfo:
        """Poll until the run ends (or raise ``TimeoutError``); the ended run."""
        deadline = time.monotonic() + timeout
        delay = 0.1
        while True:
            info = self.get(run_id)
            if info.done:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} still {info.status} after {timeout}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)


class Stands:
    """Each pipeline's stand: the subtrees runs handed over, each with its own TTL."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def list(self) -> builtins.list[StandSummary]:
        """Every stand that exists, with how much it holds."""
        return [StandSummary.from_api(item) for item in self._t.get("stands/")]

    def get(self, pipeline: str) -> StandInfo:
        """What the pipeline's stand holds (``id`` None: nothing was handed to it yet);
        ``ClientError`` 404 for a pipeline that is not loaded."""
        return StandInfo.from_api(pipeline, self._t.get(f"stands/{pipeline}/"))

    def ensure(self, pipeline: str) -> str:
        """The id of the pipeline's stand, made now if nothing was handed to it yet (to hold
        an uploaded artifact, say), as ``graphenectl apply graphene.stand PIPELINE`` would: in
        the pipeline's namespace, where its runs hand things over."""
        stand = self.get(pipeline)
        if stand.id is None:
            namespace = self._t.get(f"pipelines/{pipeline}/").get("namespace") or "default"
            try:
                made = self._t.post("records/", {"kind": "graphene.stand", "name": pipeline, "namespace": namespace})
                return str(made["id"])
            except ClientError:
                stand = self.get(pipeline)  # made meanwhile, by a run or another client?
                if stand.id is None:
                    raise
        return str(stand.id)


class Artifacts:
    """Artifacts: bytes in Graphene's blob store, each held by a record (owner, TTL, cascade).
    Reads check the bytes against the artifact's sha256; uploads send their digest so that
    the server refuses damaged bytes."""

    def __init__(self, transport: Transport, *, namespace: str | None = None) -> None:
        self._t = transport
        self._namespace = namespace

    def list(
        self,
        *,
        name: str | None = None,
        pipeline: str | None = None,
        run: str | None = None,
        labels: Labels | None = None,
        include_deleted: bool = False,
        namespace: str | None = None,
        page_size: int = 100,
    ) -> Paged[ArtifactInfo]:
        """Artifacts newest first: of a name, of a pipeline (held by its stand or published by
        its runs), published by a run, with labels, in ``namespace`` (the client's if not
        given, ``"*"`` for every one you may see)."""
        params: Params = {
            "name": name,
            "pipeline": pipeline,
            "run": run,
            "label": _labels(labels),
            "include_deleted": include_deleted,
            "namespace": _namespace(self._namespace, namespace),
        }
        return Paged(self._t, "artifacts/", params, ArtifactInfo.from_api, page_size=page_size)

    def get(self, artifact_id: str) -> ArtifactInfo:
        """An artifact's metadata by id."""
        return ArtifactInfo.from_api(self._t.get(f"artifacts/{artifact_id}/"))

    def find(self, name: str, *, pipeline: str | None = None, namespace: str | None = None) -> ArtifactInfo:
        """The newest artifact of this name (of ``pipeline``'s, if given, in ``namespace`` as
        for ``list``); ``ClientError`` 404 if none."""
        found = self.list(name=name, pipeline=pipeline, namespace=namespace, page_size=1).first(1)
        if not found:
            where = f" of pipeline {pipeline!r}" if pipeline else ""
            raise ClientError(f"no artifact named {name!r}{where}", status=404, code="not_found")
        return found[0]

    def _info(self, artifact: str | ArtifactInfo) -> ArtifactInfo:
        return artifact if isinstance(artifact, ArtifactInfo) else self.get(artifact)

    def _stream(self, info: ArtifactInfo, out: IO[bytes]) -> None:
        """The bytes into ``out``, checked against the artifact's size and sha256."""
        hasher = hashlib.sha256()
        size = 0
        path = f"artifacts/{info.id}/content/"
        with self._t.open_raw("GET", path, timeout=max(self._t.timeout, 60)) as response:
            while chunk := response.read(CHUNK):
                hasher.update(chunk)
                out.write(chunk)
                size += len(chunk)
        if hasher.hexdigest() != info.sha256 or size != info.size:
            raise ClientError(
                f"the download of artifact {info.name!r} ({info.id}) is damaged: {size} bytes, sha256 "
                f"{hasher.hexdigest()}; expected {info.size} bytes, {info.sha256}. Try again",
                status=0,
                code="damaged",
            )

    def read(self, artifact: str | ArtifactInfo) -> bytes:
        """The artifact's bytes (held in memory: ``download`` big ones)."""
        buffer = io.BytesIO()
        self._stream(self._info(artifact), buffer)
        return buffer.getvalue()

    def download(self, artifact: str | ArtifactInfo, to: str | os.PathLike[str]) -> Path:
        """Save the artifact at ``to`` (a directory: under its name's last part), streamed to a
        file beside it and renamed once complete and checked. Returns the path written."""
        info = self._info(artifact)
        target = Path(to)
        if target.is_dir():
            target = target / PurePosixPath(info.name).name
        partial = target.with_name(f".{target.name}.{os.getpid()}.part")
        try:
            with partial.open("wb") as out:
                self._stream(info, out)
            os.replace(partial, target)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        return target

    def put(
        self,
        data: bytes | os.PathLike[str],
        *,
        name: str,
        owner: str,
        content_type: str | None = None,
        labels: Mapping[str, str] | None = None,
        ttl: timedelta | float | None = None,
    ) -> ArtifactInfo:
        """Upload ``data`` (bytes, or the path of a file, streamed) as artifact ``name`` held
        by record ``owner`` (a stand's id: ``client.stands.ensure(pipeline)``), deleted after
        ``ttl`` if given. The same bytes under the same name and owner again change nothing;
        other bytes under a name the owner already holds are refused (``ClientError`` 409)."""
        if isinstance(data, str):  # for callers without a type checker: text or a path?
            raise TypeError("put takes bytes or a pathlib.Path, not str: encode text, or wrap a path in Path()")
        with contextlib.ExitStack() as stack:
            payload: bytes | IO[bytes]
            if isinstance(data, bytes | bytearray):
                payload = bytes(data)
                digest, size = hashlib.sha256(payload).hexdigest(), len(payload)
            else:
                path = Path(data)
                hasher = hashlib.sha256()
                with path.open("rb") as stream:
                    while chunk := stream.read(CHUNK):
                        hasher.update(chunk)
                digest, size = hasher.hexdigest(), path.stat().st_size
                payload = stack.enter_context(path.open("rb"))  # sent as it is read
            params: Params = {
                "name": name,
                "owner": owner,
                "sha256": digest,
                "content_type": content_type,
                "ttl_seconds": _seconds(ttl),
                "label": _labels(labels),
            }
            headers = {
                "Content-Type": "application/octet-stream",
                "Content-Length": str(size),
                "Accept": "application/json",
            }
            timeout = max(self._t.timeout, 300)
            response = self._t.open_raw(
                "POST", "artifacts/", params=params, data=payload, headers=headers, timeout=timeout
            )
            with response:
                body = json.loads(response.read())
        return ArtifactInfo.from_api(body)
