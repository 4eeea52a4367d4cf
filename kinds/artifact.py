"""The ``artifact`` kind: immutable bytes in Graphene's blob store, named by their sha256.

The record is the artifact (name, digest, size, content type) and gives it an owner, a TTL and
cascade deletion; the blob is stored by ``apps.artifacts.services`` *before* the record is
declared, so ``create`` only confirms it is there. The digest is the marker (I4): one blob may
be named by many records (deduplication), and ``delete`` removes it only when no other live
artifact record names it. ``sweep`` lists blobs that no live record names (and abandoned
partial uploads), older than a grace period, for the orphan sweeper.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from kinds import Kind, Marked, Observed, PermanentError

if TYPE_CHECKING:
    from apps.records.models import Record


class ArtifactKind(Kind):
    name = "artifact"
    description = (
        "Immutable bytes in Graphene's blob store (ctx.publish_artifact, POST /api/v1/artifacts/), "
        "deduplicated by sha256; deleting the last record that names a blob removes it."
    )
    # Nothing changes an artifact; the hourly look only notices a blob removed by hand.
    drift_interval = timedelta(hours=1)
    spec_schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 200, "description": "the artifact's name"},
            "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$", "description": "the blob's digest"},
            "size": {"type": "integer", "minimum": 0, "description": "bytes"},
            "content_type": {"type": "string", "minLength": 1, "maxLength": 200},
        },
        "required": ["name", "sha256", "size"],
        "additionalProperties": False,
    }

    def create(self, record: Record) -> dict[str, Any]:
        from apps.artifacts import blobs

        sha256 = str(record.spec["sha256"])
        try:
            size = blobs.path_of(sha256).stat().st_size
        except FileNotFoundError:
            raise PermanentError(
                f"the blob sha256:{sha256} is not in the artifact store; store the bytes with "
                "POST /api/v1/artifacts/ or ctx.publish_artifact (a record cannot create them)"
            ) from None
        if size != record.spec["size"]:
            raise PermanentError(f"the blob sha256:{sha256} has {size} bytes, the spec says {record.spec['size']}")
        return self._outputs(record)

    @staticmethod
    def _outputs(record: Record) -> dict[str, Any]:
        spec = record.spec
        return {
            "name": spec["name"],
            "sha256": spec["sha256"],
            "digest": f"sha256:{spec['sha256']}",
            "size": spec["size"],
            "content_type": spec.get("content_type") or "application/octet-stream",
        }

    def observe(self, record: Record) -> Observed | None:
        from apps.artifacts import blobs

        return Observed(self._outputs(record)) if blobs.exists(str(record.spec["sha256"])) else None

    def delete(self, record: Record) -> None:
        from apps.artifacts.services import artifact_blob_release

        artifact_blob_release(record=record)

    def sweep(self) -> Iterable[Marked]:
        from apps.artifacts.services import artifact_orphans

        for external_id, record_id in artifact_orphans():
            yield Marked(external_id=external_id, record_id=record_id)

    def delete_external(self, external_id: str) -> None:
        from apps.artifacts.services import artifact_orphan_delete

        artifact_orphan_delete(external_id)
