"""``docker.volume``: a named Docker volume ``g-<record name>-<first 8 of id>``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import docker.errors
from graphene_sdk.libs.docker import object_name

from kinds import Drift, Marked, Observed
from kinds.docker._common import (
    AGENT_PROPERTY,
    DockerKind,
    claim,
    client,
    labels_for,
    list_or_nothing,
    on_engine,
    record_filter,
    sweep_filter,
    sweep_marked,
    translate_errors,
)

if TYPE_CHECKING:
    from apps.records.models import Record


def _outputs(volume: Any, *, adopted: bool | None = None) -> dict[str, Any]:
    attrs = volume.attrs
    outputs = {"name": attrs.get("Name"), "driver": attrs.get("Driver"), "mountpoint": attrs.get("Mountpoint")}
    if adopted is not None:
        outputs["adopted"] = adopted
    return outputs


class VolumeKind(DockerKind):
    name = "docker.volume"
    description = (
        "A named Docker volume (g-<name>-<id8>), removed with its record (its data too). "
        "Deleting it while a container still uses it is retried until the container is gone."
    )
    spec_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "driver": {"type": "string", "minLength": 1, "default": "local"},
            "options": {"type": "object", "additionalProperties": {"type": "string"}},
            "agent": AGENT_PROPERTY,
        },
        "additionalProperties": False,
    }

    def _find(self, record: Record) -> Any | None:
        with translate_errors(f"list the volumes of record {record.pk}"):
            found = client().volumes.list(filters=record_filter(record))
        return found[0] if found else None

    @on_engine("create")
    def create(self, record: Record) -> dict[str, Any]:
        existing = self._find(record)
        if existing is not None:
            return _outputs(existing, adopted=True)
        name = object_name(record.name, str(record.pk))
        with translate_errors(f"create volume {name}"):
            # Docker answers "create" of an existing name with that volume, whoever made it:
            # look first, so a stranger's volume is refused rather than silently shared.
            try:
                return _outputs(claim(record, client().volumes.get(name), f"volume {name}"), adopted=True)
            except docker.errors.NotFound:
                pass
            volume = client().volumes.create(
                name=name,
                driver=record.spec.get("driver", "local"),
                driver_opts=record.spec.get("options") or None,
                labels=labels_for(record, self.name),
            )
        return _outputs(volume, adopted=False)

    @on_engine("observe")
    def observe(self, record: Record) -> Observed | None:
        volume = self._find(record)
        return Observed(_outputs(volume)) if volume is not None else None

    def diff(self, record: Record, observed: Observed) -> list[Drift]:
        want = record.spec.get("driver", "local")
        actual = observed.outputs.get("driver")
        return [Drift("driver", want, actual)] if actual != want else []

    @on_engine("delete")
    def delete(self, record: Record) -> None:
        with translate_errors(f"list the volumes of record {record.pk}"):
            found = client().volumes.list(filters=record_filter(record))
        for volume in found:
            self._remove(str(volume.name))

    def _remove(self, name: str) -> None:
        try:
            with translate_errors(f"remove volume {name}"):  # in use (409): retried
                client().volumes.get(name).remove()
        except docker.errors.NotFound:
            return

    def sweep(self) -> Iterable[Marked]:
        found = list_or_nothing(self.name, lambda: client().volumes.list(filters=sweep_filter(self.name)))
        return list(sweep_marked(found, id_of=lambda v: str(v.name)))

    def delete_external(self, external_id: str) -> None:
        self._remove(external_id)
