"""``GRAPHENE_PIPELINE_DIRS`` as local sources: each directory is delivered as revisions of a
source of its own in the default namespace (``dir-<name>-<hash of its path>``), pushed again
(a new revision, activated) whenever its files changed. Embedded mode and the tests use it for
the example pipelines; an installation delivers its code with ``graphenectl pipeline push``
or git sources instead.

Looked at when pipelines are listed and when a pipeline name is not found: a walk of the
directories' file sizes and times, and one query per directory; the files are packed and
described only when they changed (or when the revision is gone from the database).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import uuid
from pathlib import Path

from django.conf import settings
from django.utils import timezone
from graphene_sdk import _delivery

from apps.core.access import DEFAULT_NAMESPACE
from apps.core.errors import GrapheneError
from apps.pipelines.delivery import revisions
from apps.pipelines.models import Revision, Source

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_warned: set[str] = set()  # directories that are not, said once
# directory -> (its files' fingerprint, the revision made of them)
_delivered: dict[str, tuple[tuple[tuple[str, int, int], ...], uuid.UUID]] = {}
_looked_at = 0.0  # time.monotonic() of the last look


def source_name(directory: Path) -> str:
    """The name of the source a directory is delivered as."""
    stem = "".join(c if c.isalnum() or c == "-" else "-" for c in directory.name)[:60] or "dir"
    return f"dir-{stem}-{hashlib.sha256(str(directory).encode()).hexdigest()[:8]}"


def _fingerprint(directory: Path) -> tuple[tuple[str, int, int], ...]:
    found = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = sorted(d for d in dirnames if d not in _delivery.SKIPPED_DIRS)
        for name in sorted(filenames):
            if name.endswith(_delivery.SKIPPED_SUFFIXES):
                continue
            path = os.path.join(dirpath, name)
            try:
                stat = os.stat(path)
            except OSError:
                continue
            found.append((os.path.relpath(path, directory), stat.st_size, stat.st_mtime_ns))
    return tuple(found)


def dirs_deliver(*, max_age: float = 0.0) -> None:
    """Deliver each directory of ``GRAPHENE_PIPELINE_DIRS`` whose files changed since this
    process last did (or whose revision is gone), unless it looked less than ``max_age``
    seconds ago. A directory whose code is refused keeps its previous revision active; the
    reason is logged and kept on its source."""
    global _looked_at
    directories = [Path(d).resolve() for d in settings.GRAPHENE_PIPELINE_DIRS if d]
    if not directories:
        return
    with _lock:
        if max_age and time.monotonic() - _looked_at < max_age:
            return
        for directory in directories:
            _deliver(directory)
        _looked_at = time.monotonic()


def _deliver(directory: Path) -> None:
    key = str(directory)
    if not directory.is_dir():
        if _delivered.pop(key, None) is not None or key not in _warned:
            logger.warning("GRAPHENE_PIPELINE_DIRS names %s, which is not a directory", directory)
            _warned.add(key)
        return
    fingerprint = _fingerprint(directory)
    known = _delivered.get(key)
    if known is not None and known[0] == fingerprint and Revision.objects.filter(pk=known[1]).exists():
        return
    source, _ = Source.objects.get_or_create(namespace=DEFAULT_NAMESPACE, name=source_name(directory))
    now = timezone.now()
    try:
        done = revisions.revision_materialize(tree=directory, namespace=DEFAULT_NAMESPACE, source=source, activate=True)
    except GrapheneError as exc:
        Source.objects.filter(pk=source.pk).update(error=exc.detail, error_at=now, updated_at=now)
        logger.error("the pipelines of %s are not delivered: %s", directory, exc.detail)
        _delivered.pop(key, None)
        return
    Source.objects.filter(pk=source.pk).update(
        revision=done.revision, synced_at=now, error="", error_at=None, updated_at=now
    )
    if done.created or done.activated:
        logger.info(
            "%s delivered as revision %s (%s)",
            directory,
            done.revision.short,
            ", ".join(done.revision.pipeline_names()),
        )
    _delivered[key] = (fingerprint, done.revision.pk)
