"""Revisions: materializing pipeline code (a pushed archive, a git commit's tree) into an
immutable revision, activating a revision's pipelines, and reading them.

Materializing a tree: pack it canonically (its digest depends on the files alone), and if the
namespace has no revision of that digest yet, describe it in a fresh subprocess with a time
limit (``python -I -m graphene_sdk._delivery describe``: it imports the code, so nothing the
code does reaches this process), refuse it with the reason if that fails, else store the
archive in the blob store and the manifest in a row. A refused tree changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from graphene_sdk import _delivery

from apps.artifacts import blobs
from apps.artifacts import services as artifacts
from apps.core import access, audit
from apps.core.db import is_postgresql
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.core.models import Namespace
from apps.pipelines.models import Pipeline, PipelineEvent, Revision, Source
from apps.pipelines.services import triggers

logger = logging.getLogger(__name__)

TRACEBACK_CHARS = 6000


class RevisionRefused(ValidationFailed):
    """Code that cannot be a revision: the detail says why (the import's traceback, the missing
    modules, the size) and what to do. Nothing was stored."""

    code = "revision_refused"


@dataclass
class Materialized:
    revision: Revision
    created: bool
    activated: list[str] = field(default_factory=list)


def max_bytes() -> int:
    return int(settings.GRAPHENE_REVISION_MAX_BYTES)


# --- describing -----------------------------------------------------------------------------------


def _describe(tree: Path, namespace: str) -> dict[str, Any]:
    """The manifest of the code in ``tree``, from a subprocess that imports it."""
    timeout = float(settings.GRAPHENE_REVISION_DESCRIBE_TIMEOUT_SECONDS)
    argv = [sys.executable, "-I", "-m", "graphene_sdk._delivery", "describe", str(tree), "--namespace", namespace]
    # Not this process's environment: it holds the database's and the secrets' keys.
    env = {key: os.environ[key] for key in ("PATH", "LANG", "LC_ALL", "TZ", "HOME") if key in os.environ}
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env, cwd=tree
        )
    except subprocess.TimeoutExpired:
        raise RevisionRefused(
            f"importing the code took longer than {timeout:g}s (GRAPHENE_REVISION_DESCRIBE_TIMEOUT_SECONDS): "
            "a module does work at import time that belongs in the pipeline's steps"
        ) from None
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise RevisionRefused(
            f"describing the code failed (exit {done.returncode}): {done.stderr.strip()[-TRACEBACK_CHARS:]}"
        )
    if not answer.get("ok"):
        trace = str(answer.get("traceback") or "").strip()
        detail = str(answer.get("error") or "the code cannot be described")
        raise RevisionRefused(detail + (f"\n{trace[-TRACEBACK_CHARS:]}" if trace else ""))
    manifest: dict[str, Any] = answer["manifest"]
    return manifest


def _check_names(manifest: dict[str, Any], namespace: str) -> None:
    """Pipelines of a revision are not installed on the workers, nor another namespace's."""
    from apps.pipelines.services.definitions import pipelines_load

    installed = pipelines_load()
    names = [p["name"] for p in manifest["pipelines"]]
    clash = sorted(n for n in names if n in installed)
    if clash:
        raise RevisionRefused(
            f"{', '.join(clash)}: installed on the workers (GRAPHENE_PIPELINE_MODULES or GRAPHENE_PIPELINE_DIRS); "
            "a revision cannot define a pipeline of that name: rename it, or remove it from the installed code"
        )
    elsewhere = list(
        Pipeline.objects.filter(name__in=names).exclude(namespace=namespace).values_list("name", "namespace")
    )
    if elsewhere:
        taken = ", ".join(f"{n} (namespace {ns})" for n, ns in sorted(elsewhere))
        raise RevisionRefused(f"pipeline names are unique in the installation, and these are taken: {taken}")


def _check_triggers(manifest: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each pipeline's triggers as the server keeps them; a trigger that cannot work (a cron
    expression, a timezone, a webhook without the ``event`` input) refuses the revision."""
    try:
        return {
            p["name"]: triggers.specs_check(p["name"], p.get("triggers", []), p.get("input_schema"))
            for p in manifest["pipelines"]
        }
    except triggers.TriggersRefused as exc:
        raise RevisionRefused(str(exc.detail)) from None


# --- materializing --------------------------------------------------------------------------------


def _blob_store(data: bytes, digest: str) -> None:
    staged = blobs.stage(blobs.chunks_of_bytes(data), expected_sha256=digest, limit=max_bytes())
    try:
        with transaction.atomic(), artifacts.digest_lock(digest):
            blobs.commit(staged)
    finally:
        blobs.discard(staged)


def revision_materialize(
    *,
    tree: Path,
    namespace: str,
    actor: Any = None,
    source: Source | None = None,
    commit: str = "",
    activate: bool = False,
) -> Materialized:
    """The revision of the code in ``tree`` (the namespace's existing one when it holds the
    same files), its pipelines activated when ``activate``. Call outside a transaction: the
    describe subprocess may take a while."""
    access.require_actor(actor, "create", "revisions", namespace)
    access.namespace_check(namespace)
    try:
        data = _delivery.pack(tree, max_bytes=max_bytes())
    except _delivery.TreeError as exc:
        raise RevisionRefused(str(exc)) from None
    digest = hashlib.sha256(data).hexdigest()
    existing = Revision.objects.filter(namespace=namespace, digest=digest).first()
    created = existing is None
    if existing is None:
        # Described from the canonical archive's own files: what runs is exactly what is stored.
        with tempfile.TemporaryDirectory(prefix="graphene-describe-") as scratch:
            canonical = Path(scratch) / "tree"
            canonical.mkdir()
            _delivery.unpack(data, canonical, max_bytes=max_bytes())
            manifest = _describe(canonical, namespace)
        _check_names(manifest, namespace)
        _check_triggers(manifest)
        existing, created = _revision_store(
            data=data, digest=digest, namespace=namespace, manifest=manifest, actor=actor, source=source, commit=commit
        )
    materialized = Materialized(revision=existing, created=created)
    if activate:
        materialized.activated = pipelines_activate(
            names=existing.pipeline_names(), revision=existing, actor=actor, quiet_if_active=True
        )
    return materialized


def _revision_store(
    *,
    data: bytes,
    digest: str,
    namespace: str,
    manifest: dict[str, Any],
    actor: Any,
    source: Source | None,
    commit: str,
) -> tuple[Revision, bool]:
    """The stored revision, and whether this call made it (another caller may have stored the
    same files a moment before)."""
    _blob_store(data, digest)
    who = actor if actor is not None and getattr(actor, "is_authenticated", False) else None
    try:
        with transaction.atomic():
            revision = Revision.objects.create(
                namespace=namespace,
                digest=digest,
                size=len(data),
                source=source,
                commit=commit,
                manifest=manifest,
                created_by=who,
            )
            audit.audit_write(
                action="revision.create",
                resource="revisions",
                object_id=revision.pk,
                object_name=revision.short,
                namespace=namespace,
                before=None,
                after=revision_audited(revision),
                actor=actor,
            )
    except IntegrityError:  # the same files, materialized at the same moment by another caller
        return Revision.objects.get(namespace=namespace, digest=digest), False
    logger.info(
        "revision %s materialized in namespace %s: %s", revision.short, namespace, ", ".join(revision.pipeline_names())
    )
    return revision, True


def revision_push(*, chunks: Iterable[bytes], namespace: str, actor: Any, activate: bool = True) -> Materialized:
    """A revision from an uploaded archive (a tar, gzipped or not: ``graphenectl pipeline push``)."""
    access.require_actor(actor, "create", "revisions", namespace)
    access.namespace_check(namespace)
    limit, received, parts = max_bytes(), 0, []
    for chunk in chunks:
        received += len(chunk)
        if received > limit:
            raise RevisionRefused(
                f"the archive has more than {limit:,} bytes (GRAPHENE_REVISION_MAX_BYTES): keep data out of the "
                "pipeline's directory (artifacts hold data)"
            )
        parts.append(chunk)
    if not received:
        raise RevisionRefused("the body is empty: send the directory as a tar archive (graphenectl pipeline push DIR)")
    scratch = Path(tempfile.mkdtemp(prefix="graphene-push-"))
    try:
        try:
            _delivery.unpack(b"".join(parts), scratch, max_bytes=limit)
        except _delivery.TreeError as exc:
            raise RevisionRefused(str(exc)) from None
        return revision_materialize(tree=scratch, namespace=namespace, actor=actor, activate=activate)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def revision_audited(revision: Revision) -> dict[str, Any]:
    return {
        "id": revision.pk,
        "digest": revision.digest,
        "namespace": revision.namespace,
        "source": revision.source_id,
        "commit": revision.commit,
        "pipelines": revision.pipeline_names(),
    }


# --- activating -----------------------------------------------------------------------------------


def _pipeline_fields(entry: dict[str, Any], revision: Revision) -> dict[str, Any]:
    return {
        "namespace": revision.namespace,
        "source": entry.get("source", ""),
        "description": entry.get("description", ""),
        "input_schema": entry.get("input_schema") or {},
        "output_schema": entry.get("output_schema"),
        "concurrency": entry.get("concurrency", "parallel"),
        "max_pending": entry.get("max_pending"),
        "timeout_seconds": entry.get("timeout_seconds"),
        "is_loaded": True,
        "revision": revision,
        "trigger_specs": entry.get("triggers", []),
    }


def pipeline_activate(*, name: str, revision: Revision, actor: Any = None) -> None:
    """Point pipeline ``name`` at ``revision``: new runs start on it (runs started before keep
    theirs). Activating an older revision is a rollback; the active one again is a 409."""
    if not pipelines_activate(names=[name], revision=revision, actor=actor, quiet_if_active=True):
        raise Conflict(f"revision {revision.short} is already the active revision of {name}", code="already_active")


def pipelines_activate(
    *, names: list[str], revision: Revision, actor: Any = None, quiet_if_active: bool = False
) -> list[str]:
    """Activate ``revision`` for each of ``names`` (all pipelines it defines, on a push) in one
    transaction: the rows, an event each and the audit rows written in a few statements. The
    names whose active revision changed, in order; those already on it are skipped."""
    access.require_actor(actor, "update", "pipelines", revision.namespace)
    entries = {p["name"]: p for p in revision.manifest.get("pipelines", [])}
    unknown = [n for n in names if n not in entries]
    if unknown:
        defined = ", ".join(revision.pipeline_names()) or "none"
        raise NotFound(f"revision {revision.short} defines no pipeline {unknown[0]!r}; it defines: {defined}")
    _check_names({"pipelines": [entries[n] for n in names]}, revision.namespace)
    declared = _check_triggers({"pipelines": [entries[n] for n in names]})
    who = actor if actor is not None and getattr(actor, "is_authenticated", False) else None
    changed: list[tuple[Pipeline, Revision | None]] = []
    with transaction.atomic():
        Namespace.objects.get_or_create(name=revision.namespace)
        rows = {
            r.name: r
            for r in Pipeline.objects.select_for_update(of=("self",)).select_related("revision").filter(name__in=names)
        }
        try:  # with the pipelines' rows locked: activations one after another see each other's triggers
            triggers.cycle_check(declared)
        except triggers.TriggersRefused as exc:
            raise RevisionRefused(str(exc.detail)) from None
        new: list[Pipeline] = []
        kept: list[Pipeline] = []
        for name in names:
            row = rows.get(name)
            if row is not None and row.revision_id == revision.pk:
                if not quiet_if_active:
                    raise Conflict(f"revision {revision.short} is already the active revision of {name}")
                continue
            fields = _pipeline_fields(entries[name], revision)
            previous = row.revision if row is not None else None
            if row is None:
                row = Pipeline(name=name, **fields)
                new.append(row)
            else:
                for key, value in fields.items():
                    setattr(row, key, value)
                kept.append(row)
            changed.append((row, previous))
        Pipeline.objects.bulk_create(new)
        if kept:
            now = timezone.now()
            for row in kept:
                row.updated_at = now
            Pipeline.objects.bulk_update(kept, [*_pipeline_fields(entries[kept[0].name], revision), "updated_at"])
        events, changes = [], []
        for row, previous in changed:
            rollback = previous is not None and previous.created_at > revision.created_at
            shift = f"{previous.short} → {revision.short}" if previous is not None else revision.short
            events.append(
                PipelineEvent(
                    pipeline=row,
                    reason="RolledBack" if rollback else "Activated",
                    message=f"revision {shift}",
                    data={"from": str(previous.pk) if previous else None, "to": str(revision.pk)},
                    actor=who,
                )
            )
            changes.append(
                audit.Change(
                    action="pipeline.activate",
                    resource="pipelines",
                    object_id=row.pk,
                    object_name=row.name,
                    namespace=revision.namespace,
                    before={"revision": previous.digest if previous else None},
                    after={"revision": revision.digest},
                    detail={"rollback": rollback},
                )
            )
        for row, _ in changed:  # after its activation in the pipeline's history
            events.extend(triggers.triggers_reconcile(row, declared[row.name], actor=actor))
        PipelineEvent.objects.bulk_create(events)
        audit.audit_write_many(changes, actor=actor)
    for event in events:
        logger.info("pipeline %s: %s (%s)", event.pipeline.name, event.reason, event.message)
    return [row.name for row, _ in changed]


# --- reading --------------------------------------------------------------------------------------


def revision_list(*, user: Any, namespace: str | None = None, pipeline: str | None = None) -> QuerySet[Revision]:
    qs = access.scope(Revision.objects.all(), user, "list", "revisions")
    if namespace:
        qs = qs.filter(namespace=namespace)
    if pipeline:
        if is_postgresql():
            qs = qs.filter(manifest__pipelines__contains=[{"name": pipeline}])
        else:  # SQLite (embedded mode) has no JSON containment: its few revisions are read
            ids = [r.pk for r in qs.only("id", "manifest") if pipeline in r.pipeline_names()]
            qs = qs.filter(pk__in=ids)
    return qs.select_related("source", "created_by").order_by("-created_at", "-id")


def revision_find(*, user: Any, ref: str, namespace: str | None = None) -> Revision:
    """A revision by id or by (a prefix of at least 7 characters of) its digest."""
    qs = access.scope(Revision.objects.all(), user, "get", "revisions")
    if namespace:
        qs = qs.filter(namespace=namespace)
    ref = ref.strip().lower().removeprefix("sha256:")
    matches: list[Revision]
    if len(ref) == 36 and ref.count("-") == 4:
        matches = list(qs.filter(pk=ref)[:2])
    elif len(ref) >= 7 and all(c in "0123456789abcdef" for c in ref):
        matches = list(qs.filter(Q(digest__startswith=ref))[:2])
    else:
        matches = []
    if not matches:
        where = f" in namespace {namespace}" if namespace else ""
        raise NotFound(f"no revision {ref[:80]!r}{where}: give a revision's id or at least 7 hex digits of its digest")
    if len(matches) > 1:
        raise ValidationFailed(f"{ref} names more than one revision: give more digits", fields={"revision": [ref]})
    return matches[0]


def revision_blob_holders(digests: Iterable[str]) -> set[str]:
    """The digests among ``digests`` that revisions keep in the blob store."""
    return set(Revision.objects.filter(digest__in=list(digests)).values_list("digest", flat=True))
