"""Artifact references: the bytes live in Graphene's blob store, pipelines pass references.

``ctx.publish_artifact`` stores bytes and returns an ``ArtifactRef``; ``ctx.attach_artifact``
finds one published earlier. A reference goes into a record's spec (a file's ``content``) as
``{"$artifact": "<record id>"}``: the kind reads the bytes on the server where it needs them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# How a reference is written into JSON (a record's spec): {"$artifact": "<record id>"}.
ARTIFACT_REF_KEY = "$artifact"
# Artifact names: 1-200 characters, no control characters, no surrounding blanks; '/' is
# allowed (``dist/app.tar.gz``). The name a download is saved under is the part after the last '/'.
ARTIFACT_NAME_MAX = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def artifact_name_error(name: object) -> str | None:
    """Why ``name`` is not a valid artifact name, or ``None`` if it is."""
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if not name or len(name) > ARTIFACT_NAME_MAX:
        return f"must be 1-{ARTIFACT_NAME_MAX} characters"
    if name != name.strip():
        return "must not start or end with blanks"
    if _CONTROL.search(name):
        return "must not contain control characters"
    if name.endswith("/") or name.startswith("/"):
        return "must not start or end with '/'"
    return None


@dataclass(frozen=True)
class ArtifactRef:
    """An artifact: immutable bytes identified by their sha256, held by a record of kind ``artifact``.

    ``id`` is the record's id (use it with ``graphenectl artifact get ID``); ``read()`` returns
    the bytes. Pass it as a file's content (``file(ctx, ..., content=ref)``): the spec holds
    ``{"$artifact": id}`` and the server copies the bytes when it writes the file.
    """

    id: str
    name: str
    sha256: str
    size: int
    content_type: str
    _reader: Callable[[str], bytes] | None = field(default=None, compare=False, repr=False)

    @property
    def digest(self) -> str:
        """``"sha256:<hex>"``, the form the ``file`` kind reports in its outputs."""
        return f"sha256:{self.sha256}"

    def read(self) -> bytes:
        """The artifact's bytes (all of them, in memory), read from Graphene's blob store.

        Not journaled: an artifact never changes (it is addressed by its digest), so a replay
        reads the same bytes; if it was deleted meanwhile this raises ``ResourceFailed``.
        """
        if self._reader is None:
            raise RuntimeError(
                "this ArtifactRef is not bound to a run; get it from ctx.publish_artifact/attach_artifact"
            )
        return self._reader(self.id)

    def to_json(self) -> dict[str, str]:
        """The form stored in specs: ``{"$artifact": id}``."""
        return {ARTIFACT_REF_KEY: self.id}

    @classmethod
    def from_result(cls, result: Mapping[str, Any], reader: Callable[[str], bytes] | None) -> ArtifactRef:
        """From what the runtime journaled (``id``, ``name``, ``sha256``, ``size``, ``content_type``)."""
        return cls(
            id=str(result["id"]),
            name=str(result["name"]),
            sha256=str(result["sha256"]),
            size=int(result["size"]),
            content_type=str(result["content_type"]),
            _reader=reader,
        )


def artifact_ref_id(value: Any) -> str | None:
    """The record id if ``value`` is an artifact reference in its JSON form, else ``None``."""
    if isinstance(value, Mapping) and len(value) == 1 and ARTIFACT_REF_KEY in value:
        ident = value[ARTIFACT_REF_KEY]
        return ident if isinstance(ident, str) else None
    return None
