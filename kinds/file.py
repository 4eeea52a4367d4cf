"""The ``file`` kind: a file on the server's disk (under ``GRAPHENE_FILE_ROOT``) or on an
agent's machine (``agent`` in the spec: an absolute path there).

What is done to the file is ``kinds._file_op.file_op``, one self-contained function: called
here for the server's files, run on an agent's machine for an agent's (``kinds.machine``).
It marks the file with its record id and never adopts, overwrites or removes a file that is
not marked as this record's: that is a permanent error naming the path. A file on a machine
that is gone for good is given up on after a deadline when it is deleted (an event says so).
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from kinds import Drift, Kind, Marked, Observed, PermanentError, content_ref
from kinds._file_op import file_op
from kinds.machine import Abandoned, Call, machines

if TYPE_CHECKING:
    from apps.records.models import Record

SIDECAR_SUFFIX = ".graphene-record"


def root() -> Path:
    return Path(settings.GRAPHENE_FILE_ROOT).resolve()


def resolve(path: str) -> Path:
    """The absolute path for a spec path; refuses anything outside the file root."""
    base = root()
    target = (base / path).resolve()
    if target != base and base not in target.parents:
        raise PermanentError(f"path {path!r} is outside the file root {base}")
    if target == base:
        raise PermanentError("path must name a file under the file root, not the root itself")
    return target


def read_marker(target: Path) -> str | None:
    """The id of the record that owns the file at ``target`` (``None``: no Graphene marker)."""
    found = file_op("marker", str(target))
    return str(found["record"]) if found else None


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _machine_path(record: Record) -> str:
    """The file's path on its agent's machine: absolute, normalized, not a directory."""
    path = str(record.spec["path"])
    if not path.startswith("/"):
        raise PermanentError(f"path {path!r} on an agent's machine must be absolute (e.g. /etc/app/app.conf)")
    normal = os.path.normpath(path)
    if normal == "/" or path.endswith("/"):
        raise PermanentError(f"path {path!r} must name a file, not a directory")
    return normal


def _content(record: Record) -> bytes:
    """The file's bytes; a secret reference is read here, at the point of use, and never
    stored anywhere but in the file (I7): the record keeps the name, outputs only a digest."""
    content = record.spec["content"]
    if isinstance(content, dict):  # {"$secret": name} or {"$artifact": id}
        from apps.artifacts.services import content_resolve
        from apps.core.errors import GrapheneError

        try:
            return content_resolve(content, namespace=record.namespace)
        except GrapheneError as exc:  # a missing secret or artifact: retrying cannot help
            raise PermanentError(f"cannot read the file's content: {exc.detail}") from exc
    return str(content).encode()


def _content_digest(record: Record) -> str:
    """``digest(_content(record))``; an artifact's comes from its record, its blob is not read."""
    content = record.spec["content"]
    if isinstance(content, dict) and "$artifact" in content:
        from apps.artifacts.services import content_digest
        from apps.core.errors import GrapheneError

        try:
            return content_digest(content, namespace=record.namespace)
        except GrapheneError as exc:
            raise PermanentError(f"cannot read the file's content: {exc.detail}") from exc
    return digest(_content(record))


class FileKind(Kind):
    name = "file"
    description = (
        "A file with the given content and mode: on the Graphene server's disk, under GRAPHENE_FILE_ROOT, "
        "or on an agent's machine."
    )
    drift_interval = timedelta(seconds=60)
    placement = ("path", "agent")
    spec_schema = {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "minLength": 1,
                "description": "on the server: relative to the file root; on an agent's machine: absolute",
            },
            "content": content_ref(
                "UTF-8 text, a secret reference {'$secret': name} or an artifact {'$artifact': id}, "
                "read when the file is written"
            ),
            "mode": {"type": "integer", "minimum": 0, "maximum": 0o7777, "default": 0o644},
            "agent": {
                "type": "string",
                "format": "uuid",
                "description": "the agent record whose machine holds the file (absent: the server)",
            },
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }

    def create(self, record: Record) -> dict[str, Any]:
        data = _content(record)
        mode = int(record.spec.get("mode", 0o644))
        agent_id = record.spec.get("agent")
        if agent_id:
            args = ["write", _machine_path(record), str(record.id), base64.b64encode(data).decode(), mode]
            content = record.spec["content"]
            secret = isinstance(content, dict) and "$secret" in content  # never stored in the clear (I7)
            outputs = machines().run(record, agent_id, "write", Call(file_op, args, sealed=secret, in_process=True))
            return {**outputs, "agent": agent_id}
        target = resolve(record.spec["path"])
        try:
            outputs = file_op("write", str(target), str(record.id), base64.b64encode(data).decode(), mode)
        except FileExistsError as exc:
            raise PermanentError(str(exc)) from None
        assert outputs is not None
        return outputs

    def observe(self, record: Record) -> Observed | None:
        agent_id = record.spec.get("agent")
        if agent_id:
            call = Call(file_op, ["observe", _machine_path(record)], in_process=True)
            found = machines().observe(record, agent_id, call)
            return None if found is None else Observed({**found, "agent": agent_id})
        found = file_op("observe", str(resolve(record.spec["path"])))
        return None if found is None else Observed(found)

    def diff(self, record: Record, observed: Observed) -> list[Drift]:
        want = _content_digest(record)
        drifts = []
        if observed.outputs.get("digest") != want:
            drifts.append(Drift("content", want, observed.outputs.get("digest")))
        mode = int(record.spec.get("mode", 0o644))
        if observed.outputs.get("mode") != mode:
            drifts.append(Drift("mode", mode, observed.outputs.get("mode")))
        return drifts

    def delete(self, record: Record) -> None:
        agent_id = record.spec.get("agent")
        if agent_id:
            try:
                path = _machine_path(record)
            except PermanentError:
                return  # an invalid path never produced a file
            try:
                call = Call(file_op, ["remove", path, str(record.id)], in_process=True)
                machines().run(record, agent_id, "remove", call, deleting=True)
            except Abandoned as exc:
                machines().abandon(record, exc, left=f"the file {path}")
            return
        try:
            target = resolve(record.spec["path"])
        except PermanentError:
            return  # an invalid path never produced a file
        file_op("remove", str(target), str(record.id))

    def sweep(self) -> Iterable[Marked]:
        base = root()
        if not base.is_dir():
            return
        for dirpath, _dirnames, filenames in os.walk(base):
            for filename in filenames:
                if filename.endswith(SIDECAR_SUFFIX) or filename.endswith(".tmp"):
                    continue
                path = Path(dirpath) / filename
                marker = read_marker(path)
                if marker:
                    yield Marked(external_id=str(path), record_id=marker)

    def delete_external(self, external_id: str) -> None:
        marker = read_marker(Path(external_id))
        if marker:
            file_op("remove", external_id, marker)
