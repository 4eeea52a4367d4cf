"""The blob store: content-addressed files under ``GRAPHENE_ARTIFACT_ROOT``.

Layout::

    <root>/sha256/ab/abcdef…   one file per distinct content, named by its sha256, read-only
    <root>/tmp/<random>.part   an upload or publish being written (same file system: rename is atomic)

A blob is written in two steps. ``stage`` streams the bytes into a temporary file, hashing
and counting them as they come (never more than a chunk in memory), refuses more than the
size limit, compares the digest with the one the caller expected, and fsyncs the file.
``commit`` then moves it into place with ``os.replace`` and fsyncs the directory, so a blob
is either absent or complete and correct; if the digest is stored already it only drops the
staged copy (deduplication). ``commit`` and ``remove`` are called by the services under the
digest's lock (``services.digest_lock``), which is what makes dedup safe against deletion.

This module knows files only; which blobs are in use is the records' business (services).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from django.conf import settings

from apps.core.errors import GrapheneError, ValidationFailed

CHUNK = 1024 * 1024
SHA256 = re.compile(r"[0-9a-f]{64}")


class TooLarge(GrapheneError):
    """More bytes than ``GRAPHENE_ARTIFACT_MAX_BYTES``."""

    status_code = 413
    code = "too_large"


class BlobMissing(GrapheneError):
    """A record names a digest whose blob is not (or no longer) in the store."""

    status_code = 410
    code = "blob_missing"


def root() -> Path:
    return Path(settings.GRAPHENE_ARTIFACT_ROOT)


def max_bytes() -> int:
    return int(settings.GRAPHENE_ARTIFACT_MAX_BYTES)


def _tmp_dir() -> Path:
    path = root() / "tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_sha256(value: str, *, field: str = "sha256") -> str:
    """A lowercase hex sha256 (a ``sha256:`` prefix is accepted), or a field error."""
    digest = value.strip().lower().removeprefix("sha256:")
    if not SHA256.fullmatch(digest):
        raise ValidationFailed(f"{field} must be 64 hex digits (a sha256), got {value[:80]!r}", fields={field: [value]})
    return digest


def path_of(sha256: str) -> Path:
    digest = check_sha256(sha256)
    return root() / "sha256" / digest[:2] / digest


def exists(sha256: str) -> bool:
    return path_of(sha256).is_file()


@dataclass
class Staged:
    """Bytes written to a temporary file, hashed and counted; ``commit`` or ``discard`` it."""

    path: Path
    sha256: str
    size: int


def stage(chunks: Iterable[bytes], *, expected_sha256: str | None = None, limit: int | None = None) -> Staged:
    """Stream ``chunks`` into a temporary file in the store; nothing is left behind on failure."""
    limit = max_bytes() if limit is None else limit
    expected = check_sha256(expected_sha256) if expected_sha256 else None
    path = _tmp_dir() / f"{secrets.token_hex(16)}.part"
    hasher = hashlib.sha256()
    size = 0
    try:
        with path.open("xb") as out:
            for chunk in chunks:
                if not chunk:
                    continue
                size += len(chunk)
                if size > limit:
                    raise TooLarge(
                        f"the artifact is larger than the limit of {limit} bytes (GRAPHENE_ARTIFACT_MAX_BYTES)",
                        fields={"size": [f"at most {limit} bytes"]},
                    )
                hasher.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        digest = hasher.hexdigest()
        if expected is not None and digest != expected:
            raise ValidationFailed(
                f"the content's sha256 is {digest}, not the expected {expected}: it was damaged on the way; "
                "nothing was stored",
                code="digest_mismatch",
                fields={"sha256": [f"expected {expected}, got {digest}"]},
            )
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return Staged(path=path, sha256=digest, size=size)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(staged: Staged) -> bool:
    """Move a staged file into place (call under the digest's lock). Returns whether it was new.

    An existing blob of that digest is kept (its mtime refreshed, which the sweeper's grace
    period reads) and the staged copy dropped.
    """
    target = path_of(staged.sha256)
    if target.is_file():
        discard(staged)
        with contextlib.suppress(OSError):
            os.utime(target)
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(staged.path, 0o440)
    os.replace(staged.path, target)
    _fsync_dir(target.parent)
    return True


def discard(staged: Staged) -> None:
    """Remove the staged file if it is still there (``commit`` moved it otherwise)."""
    staged.path.unlink(missing_ok=True)


def remove(sha256: str) -> bool:
    """Remove a blob (call under the digest's lock, once no record uses it)."""
    target = path_of(sha256)
    try:
        target.unlink()
    except FileNotFoundError:
        return False
    with contextlib.suppress(OSError):
        _fsync_dir(target.parent)
    return True


def open_blob(sha256: str) -> BinaryIO:
    try:
        return path_of(sha256).open("rb")
    except FileNotFoundError:
        raise BlobMissing(
            f"the blob sha256:{sha256} is not in the artifact store ({root()}); it was removed outside Graphene"
        ) from None


def read_bytes(sha256: str, *, verify: bool = True) -> bytes:
    """The whole blob in memory, its digest checked (for small reads: ``ArtifactRef.read``, files)."""
    with open_blob(sha256) as blob:
        data = blob.read()
    if verify and hashlib.sha256(data).hexdigest() != sha256:
        raise BlobMissing(f"the blob sha256:{sha256} is damaged (its content no longer has that digest)")
    return data


def chunks_of(stream: BinaryIO, chunk: int = CHUNK) -> Iterator[bytes]:
    while True:
        data = stream.read(chunk)
        if not data:
            return
        yield data


def chunks_of_bytes(data: bytes, chunk: int = CHUNK) -> Iterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(view), chunk):
        yield bytes(view[start : start + chunk])


def chunks_of_path(path: Path) -> Iterator[bytes]:
    with path.open("rb") as stream:
        yield from chunks_of(stream)


def listing(*, older_than: float) -> Iterator[tuple[str, Path]]:
    """Blobs (``("sha256", path)``) and staged files (``("tmp", path)``) last touched more than
    ``older_than`` seconds ago, for the orphan sweeper."""
    base = root()
    cutoff = time.time() - older_than
    for sub, kind in (("sha256", "sha256"), ("tmp", "tmp")):
        top = base / sub
        if not top.is_dir():
            continue
        for dirpath, _dirnames, filenames in os.walk(top):
            for filename in filenames:
                path = Path(dirpath) / filename
                try:
                    if path.stat().st_mtime >= cutoff:
                        continue
                except FileNotFoundError:
                    continue
                if kind == "sha256" and not SHA256.fullmatch(filename):
                    continue
                yield kind, path
