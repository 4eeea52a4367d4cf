"""The agent zipapp: ``graphene_agent`` plus a vendored ``websockets``, one file, stdlib Python >= 3.9.

The archive is reproducible (sorted entries, fixed timestamps), so the same sources always
give the same SHA-256, which install scripts pin. It is rebuilt when the sources change.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import io
import json
import os
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

import graphene_agent
import websockets
from django.conf import settings

SHEBANG = b"#!/usr/bin/env python3\n"
MAIN = b"import sys\n\nfrom graphene_agent.cli import main\n\nsys.exit(main())\n"
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
_lock = threading.Lock()


@dataclass(frozen=True)
class Bundle:
    path: Path
    sha256: str
    size: int
    version: str


def _package_files(package_dir: Path) -> list[tuple[str, Path]]:
    """(archive name, file) for the pure-Python part of a package: compiled speedups cannot be
    imported from a zip and belong to one interpreter; websockets falls back to Python."""
    files = []
    for path in sorted(package_dir.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        if path.suffix in {".py", ".typed"}:
            files.append((f"{package_dir.name}/{path.relative_to(package_dir).as_posix()}", path))
    return files


def _sources() -> list[tuple[str, bytes]]:
    entries: list[tuple[str, bytes]] = [("__main__.py", MAIN)]
    for package in (graphene_agent, websockets):
        assert package.__file__ is not None
        entries += [(name, path.read_bytes()) for name, path in _package_files(Path(package.__file__).parent)]
    dist = importlib.metadata.distribution("websockets")
    for file in dist.files or []:
        if file.name.upper().startswith("LICENSE"):
            entries.append((f"websockets-{dist.version}.LICENSE", Path(str(file.locate())).read_bytes()))
    return sorted(entries)


def _fingerprint(entries: list[tuple[str, bytes]]) -> str:
    digest = hashlib.sha256()
    for name, data in entries:
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def _write(target: Path, entries: list[tuple[str, bytes]]) -> None:
    buffer = io.BytesIO()
    buffer.write(SHEBANG)  # a zipapp: the interpreter line, then the zip (offsets are from the end)
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".graphene-agent-", suffix=".tmp")
    with os.fdopen(fd, "wb") as out:
        out.write(buffer.getvalue())
    os.chmod(tmp, 0o755)  # noqa: S103 - an executable zipapp anyone may download; it holds no secret
    os.replace(tmp, target)  # readers see the old file or the new one, never half of one


def _meta_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def agent_bundle(*, rebuild: bool = False) -> Bundle:
    """The zipapp at ``GRAPHENE_AGENT_PYZ``, built first if missing, stale or asked to."""
    path = Path(settings.GRAPHENE_AGENT_PYZ)
    with _lock:
        entries = _sources()
        fingerprint = _fingerprint(entries)
        meta: dict[str, str] = {}
        with contextlib.suppress(OSError, ValueError):  # no or a bad sidecar: rebuild
            meta = json.loads(_meta_path(path).read_text())
        if rebuild or not path.exists() or meta.get("fingerprint") != fingerprint:
            _write(path, entries)
            meta = {
                "fingerprint": fingerprint,
                "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                "version": graphene_agent.__version__,
            }
            _meta_path(path).write_text(json.dumps(meta))
        return Bundle(path=path, sha256=meta["sha256"], size=path.stat().st_size, version=meta["version"])
