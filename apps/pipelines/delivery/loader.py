"""Loading revisions in this process: each into its own package (``graphene_revisions.r<digest>``),
so that two revisions of one pipeline run side by side; unpacked from the blob store into
``GRAPHENE_REVISION_DIR`` the first time a process needs one, imported once, and kept for the
``GRAPHENE_REVISION_CACHE_SIZE`` most recently used revisions (the modules of the others are
forgotten: a run that needs one again imports it again)."""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from django.conf import settings
from graphene_sdk import Pipeline as Definition
from graphene_sdk import _delivery

from apps.artifacts import blobs
from apps.core.errors import GrapheneError
from apps.pipelines.models import Revision

logger = logging.getLogger(__name__)

_lock = threading.RLock()
_loaded: OrderedDict[str, dict[str, Definition[Any, Any]]] = OrderedDict()  # by package name


class RevisionUnavailable(GrapheneError):
    """A revision's code cannot be loaded here (its archive is gone, or importing it fails)."""

    status_code = 503
    code = "revision_unavailable"


def unpacked(digest: str) -> Path:
    """The revision's tree on this machine, unpacked from its blob if it is not there yet
    (into a temporary directory renamed into place: a tree is there whole or not at all)."""
    target = Path(settings.GRAPHENE_REVISION_DIR) / digest
    if target.is_dir():
        return target
    if not blobs.exists(digest):
        raise RevisionUnavailable(f"revision {digest[:12]}'s archive is not in the blob store ({blobs.root()})")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=target.parent))
    try:
        _delivery.unpack(blobs.read_bytes(digest), staging, max_bytes=int(settings.GRAPHENE_REVISION_MAX_BYTES))
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():  # another process put it there first: theirs is the same
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def definitions(revision: Revision) -> dict[str, Definition[Any, Any]]:
    """The pipelines of ``revision``, imported in this process (once while it stays cached)."""
    digest = revision.digest
    package = _delivery.package_name(digest, revision.namespace)
    with _lock:
        found = _loaded.get(package)
        if found is not None:
            _loaded.move_to_end(package)
            return found
        began = time.monotonic()
        tree = unpacked(digest)
        try:
            found = _delivery.load(tree, package, namespace=revision.namespace)
        except Exception as exc:
            raise RevisionUnavailable(f"revision {digest[:12]} cannot be imported here: {exc}") from exc
        _loaded[package] = found
        while len(_loaded) > max(1, int(settings.GRAPHENE_REVISION_CACHE_SIZE)):
            evicted, _ = _loaded.popitem(last=False)
            _delivery.unload(evicted)
        logger.info("revision %s loaded in %.0f ms: %s", digest[:12], (time.monotonic() - began) * 1000, sorted(found))
        return found


def definition(revision: Revision, name: str) -> Definition[Any, Any]:
    found = definitions(revision).get(name)
    if found is None:
        raise RevisionUnavailable(f"revision {revision.short} defines no pipeline {name!r}")
    return found
