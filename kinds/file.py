"""The ``file`` kind: a file on the server's disk, under ``GRAPHENE_FILE_ROOT``.

The marker is the extended attribute ``user.graphene.record`` holding the record id; on a
file system without user xattrs, a sidecar ``.<name>.graphene-record`` next to the file.
A file that exists without our marker (or with another record's) is never adopted or
overwritten: that is a permanent error naming the path.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from kinds import Drift, Kind, Marked, Observed, PermanentError, string_or_secret

if TYPE_CHECKING:
    from apps.records.models import Record

XATTR = "user.graphene.record"
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


def _sidecar(target: Path) -> Path:
    return target.with_name(f".{target.name}{SIDECAR_SUFFIX}")


def read_marker(target: Path) -> str | None:
    try:
        return os.getxattr(target, XATTR).decode()
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    try:
        return _sidecar(target).read_text().strip() or None
    except FileNotFoundError:
        return None


def write_marker(target: Path, record_id: str) -> None:
    try:
        os.setxattr(target, XATTR, record_id.encode())
    except OSError as exc:
        if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        _sidecar(target).write_text(record_id)


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _content(record: Record) -> bytes:
    """The file's bytes; a secret reference is read here, at the point of use, and never
    stored anywhere but in the file (I7): the record keeps the name, outputs only a digest."""
    content = record.spec["content"]
    if isinstance(content, dict):
        from apps.core.errors import GrapheneError
        from apps.secrets.services import secret_refs_resolve

        try:
            content = secret_refs_resolve(content, namespace=record.namespace)
        except GrapheneError as exc:  # a missing secret: retrying cannot help until it exists
            raise PermanentError(f"cannot read the file's content: {exc.detail}") from exc
    return str(content).encode()


class FileKind(Kind):
    name = "file"
    description = "A file on the Graphene server's disk, under GRAPHENE_FILE_ROOT, with the given content and mode."
    drift_interval = timedelta(seconds=60)
    spec_schema = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1, "description": "path relative to the file root"},
            "content": string_or_secret(
                "UTF-8 text, or a secret reference {'$secret': name} read when the file is written"
            ),
            "mode": {"type": "integer", "minimum": 0, "maximum": 0o7777, "default": 0o644},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }

    def create(self, record: Record) -> dict[str, Any]:
        target = resolve(record.spec["path"])
        record_id = str(record.id)
        data = _content(record)
        mode = int(record.spec.get("mode", 0o644))
        owner = read_marker(target) if target.exists() else None
        if target.exists() and owner != record_id:
            whose = f"record {owner}" if owner else "no Graphene record"
            raise PermanentError(f"{target} already exists and belongs to {whose}; refusing to adopt it")
        target.parent.mkdir(parents=True, exist_ok=True)
        if owner is None:
            # Create empty and mark first, then fill: a crash in between leaves a marked file
            # that the retried create adopts, never an unmarked one.
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            os.close(fd)
            write_marker(target, record_id)
        tmp = target.with_name(f".{target.name}.{record_id}.tmp")
        tmp.write_bytes(data)
        os.chmod(tmp, mode)
        write_marker(tmp, record_id)
        os.replace(tmp, target)
        return {"path": str(target), "digest": digest(data), "size": len(data), "mode": mode}

    def observe(self, record: Record) -> Observed | None:
        target = resolve(record.spec["path"])
        try:
            data = target.read_bytes()
            mode = target.stat().st_mode & 0o7777
        except FileNotFoundError:
            return None
        return Observed({"path": str(target), "digest": digest(data), "size": len(data), "mode": mode})

    def diff(self, record: Record, observed: Observed) -> list[Drift]:
        want = digest(_content(record))
        drifts = []
        if observed.outputs.get("digest") != want:
            drifts.append(Drift("content", want, observed.outputs.get("digest")))
        mode = int(record.spec.get("mode", 0o644))
        if observed.outputs.get("mode") != mode:
            drifts.append(Drift("mode", mode, observed.outputs.get("mode")))
        return drifts

    def delete(self, record: Record) -> None:
        try:
            target = resolve(record.spec["path"])
        except PermanentError:
            return  # an invalid path never produced a file
        self._remove(target, str(record.id))

    def _remove(self, target: Path, record_id: str) -> None:
        if not target.exists():
            _sidecar(target).unlink(missing_ok=True)
            return
        if read_marker(target) != record_id:
            return  # not ours (any more): never delete someone else's file
        target.unlink(missing_ok=True)
        _sidecar(target).unlink(missing_ok=True)

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
        target = Path(external_id)
        marker = read_marker(target)
        if marker:
            self._remove(target, marker)
