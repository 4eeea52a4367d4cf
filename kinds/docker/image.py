"""``docker.image``: an image imported from a root file system tar on the Graphene server.

The tar (a path readable by the worker) is sent to dockerd as ``docker import`` does; the
image is tagged ``graphene/<record name>:<first 8 of id>`` and carries the labels (``LABEL``
changes applied on import). Deleting the record removes that tag and, if no other tag is
left, the image; while a container still uses it the delete is retried.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import docker.errors
import docker.utils
from graphene_sdk.libs.docker import image_reference

from kinds import Drift, KindError, Marked, Observed, PermanentError
from kinds.docker._common import (
    AGENT_PROPERTY,
    LABEL_SPEC,
    DockerKind,
    client,
    labels_for,
    list_or_nothing,
    on_engine,
    record_filter,
    spec_hash,
    sweep_filter,
    sweep_marked,
    translate_errors,
)

if TYPE_CHECKING:
    from apps.records.models import Record


def _outputs(image: Any, reference: str, *, adopted: bool | None = None) -> dict[str, Any]:
    outputs = {"reference": reference, "id": image.id, "tags": sorted(image.tags), "size": image.attrs.get("Size")}
    if adopted is not None:
        outputs["adopted"] = adopted
    return outputs


def _labels(image: Any) -> dict[str, str]:
    return dict((image.attrs.get("Config") or {}).get("Labels") or image.attrs.get("Labels") or {})


def _remove(image_id: str, reference: str | None) -> None:
    """Untag ``reference`` (every ``graphene/`` tag if ``None``), then remove the image if no tag
    is left. Someone else's tag keeps the image: it is theirs now. In use: retried (409)."""
    api = client().api
    try:
        with translate_errors(f"remove image {reference or image_id}"):
            tags = list(api.inspect_image(image_id).get("RepoTags") or [])
            for tag in tags:
                if tag == reference or (reference is None and tag.startswith("graphene/")):
                    api.remove_image(tag)
            left = api.inspect_image(image_id).get("RepoTags") or []
            if not left:
                api.remove_image(image_id)
    except docker.errors.NotFound:
        return


class ImageKind(DockerKind):
    name = "docker.image"
    description = (
        "An image imported (docker import) from a root file system tar on the Graphene server, "
        "tagged graphene/<name>:<id8>. Pass the handle as a container's or job's image."
    )
    spec_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "rootfs_tar": {
                "type": "string",
                "pattern": "^/",
                "description": "absolute path of a tar (optionally compressed) of a root file system, on the server",
            },
            "changes": {
                "type": "array",
                "items": {"type": "string", "minLength": 1},
                "description": "Dockerfile instructions applied on import, e.g. 'CMD [\"/bin/sh\"]'",
            },
            "agent": AGENT_PROPERTY,
        },
        "required": ["rootfs_tar"],
        "additionalProperties": False,
    }

    def _find(self, record: Record) -> list[Any]:
        with translate_errors(f"list the images of record {record.pk}"):
            return list(client().images.list(all=True, filters=record_filter(record)))

    @on_engine("create")
    def create(self, record: Record) -> dict[str, Any]:
        reference = image_reference(record.name, str(record.pk))
        digest = spec_hash(record.spec)
        for image in self._find(record):
            if _labels(image).get(LABEL_SPEC) == digest:
                if reference not in image.tags:  # someone removed our tag: put it back
                    repository, tag = docker.utils.parse_repository_tag(reference)
                    with translate_errors(f"tag image {image.id} as {reference}"):
                        image.tag(repository, tag)
                        image.reload()
                return _outputs(image, reference, adopted=True)
            _remove(image.id, reference)  # imported from an older spec: replaced below
        path = Path(record.spec["rootfs_tar"])
        if not path.is_file():
            raise PermanentError(f"rootfs_tar {path} is not a file on the Graphene server")
        repository, tag = docker.utils.parse_repository_tag(reference)
        changes = [*record.spec.get("changes", [])]
        changes += [f"LABEL {key}={json.dumps(value)}" for key, value in labels_for(record, self.name, digest).items()]
        with translate_errors(f"import {path} as {reference}"):
            answer = client().api.import_image_from_file(str(path), repository=repository, tag=tag, changes=changes)
        for image in self._find(record):
            if _labels(image).get(LABEL_SPEC) == digest:
                return _outputs(image, reference, adopted=False)
        raise KindError(f"importing {path} as {reference} made no image: {str(answer)[-500:]}")

    @on_engine("observe")
    def observe(self, record: Record) -> Observed | None:
        digest = spec_hash(record.spec)
        for image in self._find(record):
            if _labels(image).get(LABEL_SPEC) == digest:
                return Observed(_outputs(image, image_reference(record.name, str(record.pk))))
        return None

    def diff(self, record: Record, observed: Observed) -> list[Drift]:
        reference = observed.outputs.get("reference")
        tags = observed.outputs.get("tags") or []
        return [Drift("reference", reference, tags)] if reference not in tags else []

    @on_engine("delete")
    def delete(self, record: Record) -> None:
        reference = image_reference(record.name, str(record.pk))
        for image in self._find(record):
            _remove(image.id, reference)

    def sweep(self) -> Iterable[Marked]:
        found = list_or_nothing(self.name, lambda: client().images.list(all=True, filters=sweep_filter(self.name)))
        return list(sweep_marked(found, id_of=lambda i: str(i.id)))

    def delete_external(self, external_id: str) -> None:
        _remove(external_id, None)
