"""Every write of artifacts: storing blobs with their records, releasing blobs, the sweep.

An artifact is a record of kind ``artifact`` (``kinds/artifact.py``) whose spec names a blob
by its digest: ``{"name", "sha256", "size", "content_type"}``. The record gives it an owner,
a TTL and cascade deletion like any resource; the bytes live once per digest in the blob
store (``blobs``), however many records name them.

Ordering and locking (the dedup/delete race):

* A blob is staged (streamed to a temporary file, hashed, size-checked) *before* any
  transaction. Then, in one transaction holding the digest's lock, the record is declared
  and the staged file moved into place. A failed declaration leaves neither record nor blob.
* Deleting an artifact record removes the blob under the same lock, and only when no other
  live artifact record names the digest. So a publish of the same bytes either commits its
  record first (and the delete sees it and keeps the blob) or waits for the delete and then
  finds no blob and moves its own copy into place.
* What can be left behind is a blob without any record (a worker killed between the move and
  the commit): the orphan sweeper removes such blobs once they are older than
  ``GRAPHENE_ARTIFACT_SWEEP_GRACE_SECONDS``.
"""

from __future__ import annotations

import hashlib
import logging
import mimetypes
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from graphene_sdk._artifacts import artifact_name_error, artifact_ref_id

from apps.artifacts import blobs
from apps.core.db import advisory_xact_lock, lock_key
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Record
from apps.records.services import Actor

logger = logging.getLogger(__name__)

KIND = "artifact"
DEFAULT_CONTENT_TYPE = "application/octet-stream"
# Records in these phases no longer hold their blob: they are on their way out, and their own
# delete releases it (counting them would let two concurrent deletes each keep it for the other).
_RELEASED = (Phase.DELETING, Phase.DELETE_FAILED, Phase.DELETED)


class ArtifactNotFound(NotFound):
    code = "artifact_not_found"


# --- validation ---------------------------------------------------------------------------------


def artifact_name_validate(name: Any) -> str:
    error = artifact_name_error(name)
    if error is not None:
        raise ValidationFailed(f"name {error}", fields={"name": [error]})
    assert isinstance(name, str)
    return name


def content_type_validate(value: Any, *, name: str = "") -> str:
    """A media type such as ``text/plain`` (guessed from ``name`` when empty)."""
    if value in (None, ""):
        guessed, _encoding = mimetypes.guess_type(PurePosixPath(name).name) if name else (None, None)
        return guessed or DEFAULT_CONTENT_TYPE
    text = str(value).strip()
    if len(text) > 200 or "/" not in text or any(ord(c) < 32 for c in text):
        raise ValidationFailed(
            f"content_type {text[:80]!r} is not a media type such as text/plain",
            fields={"content_type": ["not a media type"]},
        )
    return text


def spec_of(*, name: str, staged: blobs.Staged, content_type: str) -> dict[str, Any]:
    return {"name": name, "sha256": staged.sha256, "size": staged.size, "content_type": content_type}


def ref_of(record: Record) -> dict[str, Any]:
    """What a run journals for an artifact (a reference, never the bytes)."""
    spec = record.spec
    return {
        "id": str(record.pk),
        "name": spec["name"],
        "sha256": spec["sha256"],
        "size": spec["size"],
        "content_type": spec.get("content_type") or DEFAULT_CONTENT_TYPE,
    }


# --- the digest lock ---------------------------------------------------------------------------


@contextmanager
def digest_lock(sha256: str) -> Iterator[None]:
    """Serialize "is this blob in use / move it in" and "remove it" for one digest.

    PostgreSQL: a transaction-scoped advisory lock (held to the end of the caller's
    transaction, which must be open). SQLite (embedded): every write transaction already
    holds the database's write lock from its start (``BEGIN IMMEDIATE``), which serializes
    these blocks just as well.
    """
    advisory_xact_lock(lock_key(f"artifact:{sha256}"))
    yield


def live_references(sha256: str) -> QuerySet[Record]:
    """Artifact records that hold the blob ``sha256``."""
    return Record.objects.filter(kind=KIND, spec__sha256=sha256).exclude(phase__in=_RELEASED)


# Others that keep blobs in the store (pipeline revisions): each answers which of the digests
# it is given it holds. Registered by their apps (``AppConfig.ready``); artifacts never import them.
_BLOB_HOLDERS: list[Callable[[Iterable[str]], set[str]]] = []


def blob_holder_register(holder: Callable[[Iterable[str]], set[str]]) -> None:
    if holder not in _BLOB_HOLDERS:
        _BLOB_HOLDERS.append(holder)


def held_elsewhere(digests: Iterable[str]) -> set[str]:
    """The digests among ``digests`` that something other than an artifact record keeps."""
    wanted = list(digests)
    held: set[str] = set()
    for holder in _BLOB_HOLDERS:
        held |= holder(wanted)
    return held


# --- storing -------------------------------------------------------------------------------------


def _existing(owner: Record, record_name: str) -> Record | None:
    return Record.objects.filter(parent=owner, kind=KIND, name=record_name).exclude(phase=Phase.DELETED).first()


def _same_or_conflict(existing: Record, staged: blobs.Staged, what: str) -> Record:
    if existing.spec.get("sha256") != staged.sha256:
        raise Conflict(
            f"{what} already exists with other content (sha256 {existing.spec.get('sha256')}, record {existing.pk}); "
            "delete it first or choose another name",
            fields={"name": ["already exists with other content"]},
        )
    if existing.deletion_requested_at is not None:
        raise Conflict(f"{what} (record {existing.pk}) is being deleted; try again once it is gone")
    return existing


def artifact_upload(
    *,
    owner: Record,
    name: str,
    chunks: Iterable[bytes],
    content_type: str | None = None,
    expected_sha256: str | None = None,
    labels: dict[str, str] | None = None,
    expires_at: datetime | None = None,
    actor: Actor = None,
) -> tuple[Record, bool]:
    """Store uploaded bytes as an artifact owned by ``owner`` (a stand or any live record).

    The record is named ``name``. Uploading the same bytes under the same name again returns
    the existing record (``created`` False); other bytes under a taken name are a ``Conflict``.
    Whatever fails (size, digest, owner, name), neither a blob nor a record is left.
    """
    name = artifact_name_validate(name)
    content_type = content_type_validate(content_type, name=name)
    labels = records.labels_validate(labels)
    if owner.phase == Phase.DELETED or owner.deletion_requested_at is not None:
        raise Conflict(f"owner {owner} ({owner.pk}) is being deleted; it cannot own new records")
    staged = blobs.stage(chunks, expected_sha256=expected_sha256)
    try:
        with transaction.atomic(), digest_lock(staged.sha256):
            existing = _existing(owner, name)
            if existing is not None:
                record = _same_or_conflict(existing, staged, f"artifact {name!r} of {owner}")
                created = False
            else:
                record = records.record_declare(
                    kind=KIND,
                    name=name,
                    owner=owner,
                    spec=spec_of(name=name, staged=staged, content_type=content_type),
                    labels=labels,
                    expires_at=expires_at,
                    actor=actor,
                )
                created = True
            blobs.commit(staged)  # last: nothing after it can fail and roll the record back
    finally:
        blobs.discard(staged)
    logger.info("artifact %s (%s, %d bytes) stored under %s", name, staged.sha256, staged.size, owner.pk)
    return record, created


def artifact_publish_for_run(
    *,
    run_root: Record,
    run_number: int,
    stand: Record,
    name: str,
    staged: blobs.Staged,
    content_type: str,
    labels: dict[str, str],
    expires_at: datetime | None,
) -> Record:
    """``ctx.publish_artifact``: the run declares the record and hands it to its pipeline's stand.

    Call inside the engine's transaction (with its journal entry). The record is named
    ``<name>@run-<number>``: a name means one content per run, so publishing it again with the
    same bytes returns the same record (its TTL pushed to the later deadline) and with other
    bytes is a ``Conflict``. ``created_by_run`` stays the publishing run.
    """
    name = artifact_name_validate(name)
    record_name = f"{name}@run-{run_number}"
    with digest_lock(staged.sha256):
        existing = _existing(stand, record_name)
        if existing is not None:
            record = _same_or_conflict(existing, staged, f"artifact {name!r} of this run")
            if existing.expires_at is not None and (expires_at is None or expires_at > existing.expires_at):
                record = records.record_set_expiry(record=existing, expires_at=expires_at, reason="Republished")
        else:
            record = records.record_declare(
                kind=KIND,
                name=record_name,
                owner=run_root,
                spec=spec_of(name=name, staged=staged, content_type=content_type),
                labels=labels,
            )
            record = records.record_transfer(record=record, new_owner=stand, given_by=run_root, expires_at=expires_at)
        blobs.commit(staged)
    return record


# --- releasing -----------------------------------------------------------------------------------


def artifact_blob_release(*, record: Record) -> bool:
    """The kind's delete: remove the record's blob unless another live artifact record names it."""
    sha256 = str(record.spec.get("sha256") or "")
    if not blobs.SHA256.fullmatch(sha256):
        return False  # an invalid spec never stored anything
    with transaction.atomic(), digest_lock(sha256):
        if live_references(sha256).exclude(pk=record.pk).exists() or held_elsewhere([sha256]):
            return False
        removed = blobs.remove(sha256)
    if removed:
        logger.info("artifact blob %s removed with record %s (no other record uses it)", sha256, record.pk)
    return removed


def artifact_orphans() -> Iterator[tuple[str, str]]:
    """``(external id, record id)`` of blobs no live record names and of abandoned staged files,
    older than the grace period. The record id is the newest (deleted) record that named the
    blob, or ``""``."""
    grace = float(settings.GRAPHENE_ARTIFACT_SWEEP_GRACE_SECONDS)
    found = list(blobs.listing(older_than=grace))
    digests = [path.name for kind, path in found if kind == "sha256"]
    live: set[str] = set()
    last: dict[str, str] = {}
    for start in range(0, len(digests), 500):
        batch = digests[start : start + 500]
        rows = Record.objects.filter(kind=KIND, spec__sha256__in=batch).order_by("created_at")
        for pk, spec, phase in rows.values_list("pk", "spec", "phase"):
            sha = str(spec.get("sha256"))
            if phase not in _RELEASED:
                live.add(sha)
            last[sha] = str(pk)
        live |= held_elsewhere(batch)
    for kind, path in found:
        if kind == "tmp":
            yield f"tmp/{path.name}", ""
        elif path.name not in live:
            yield f"sha256:{path.name}", last.get(path.name, "")


def artifact_orphan_delete(external_id: str) -> None:
    """Remove one finding of ``artifact_orphans``, checking again under the digest's lock."""
    if external_id.startswith("tmp/"):
        name = external_id.removeprefix("tmp/")
        if "/" not in name and name.endswith(".part"):
            (blobs.root() / "tmp" / name).unlink(missing_ok=True)
        return
    sha256 = blobs.check_sha256(external_id)
    with transaction.atomic(), digest_lock(sha256):
        if not live_references(sha256).exists() and not held_elsewhere([sha256]):
            blobs.remove(sha256)


# --- reading (at the point of use) ------------------------------------------------------------------


def artifact_live(record_id: Any) -> Record:
    """The live artifact record ``record_id``, or ``ArtifactNotFound`` saying why."""
    try:
        pk = uuid.UUID(str(record_id))
    except ValueError:
        raise ArtifactNotFound(f"no artifact {record_id!r}: artifact ids are record ids (UUIDs)") from None
    record = Record.objects.filter(pk=pk, kind=KIND).first()
    if record is None:
        raise ArtifactNotFound(f"no artifact {record_id}")
    if record.phase == Phase.DELETED or record.deletion_requested_at is not None:
        raise ArtifactNotFound(f"artifact {record.spec.get('name')!r} ({record.pk}) has been deleted")
    return record


def artifact_read(*, record_id: Any) -> bytes:
    """The bytes of a live artifact, in memory and verified against its digest."""
    record = artifact_live(record_id)
    return blobs.read_bytes(str(record.spec["sha256"]))


def content_resolve(value: Any, *, namespace: str = "default") -> bytes:
    """Spec content as bytes: text, ``{"$secret": name}`` or ``{"$artifact": id}``.

    For kinds, at the point of use (the record keeps the reference; the bytes are used and
    dropped). Raises a ``GrapheneError`` naming what is missing.
    """
    ident = artifact_ref_id(value)
    if ident is not None:
        return artifact_read(record_id=ident)
    if isinstance(value, dict):
        from apps.secrets.services import secret_refs_resolve

        value = secret_refs_resolve(value, namespace=namespace)
    return str(value).encode()


def content_digest(value: Any, *, namespace: str = "default") -> str:
    """``"sha256:<hex>"`` of what ``content_resolve`` returns; an artifact's comes from its record,
    without reading the blob (drift checks run every minute, artifacts may be large)."""
    ident = artifact_ref_id(value)
    if ident is not None:
        return f"sha256:{artifact_live(ident).spec['sha256']}"
    return "sha256:" + hashlib.sha256(content_resolve(value, namespace=namespace)).hexdigest()
