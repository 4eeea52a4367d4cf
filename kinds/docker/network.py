"""``docker.network``: a Docker network named ``g-<record name>-<first 8 of id>``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import docker.errors
import docker.types
from graphene_sdk.libs.docker import object_name

from kinds import Drift, Marked, Observed
from kinds.docker._common import (
    AGENT_PROPERTY,
    DockerKind,
    claim,
    client,
    is_conflict,
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


def _outputs(network: Any, *, adopted: bool | None = None) -> dict[str, Any]:
    attrs = network.attrs
    ipam = ((attrs.get("IPAM") or {}).get("Config") or [{}])[0] or {}
    outputs = {
        "name": attrs.get("Name"),
        "id": attrs.get("Id"),
        "driver": attrs.get("Driver"),
        "internal": bool(attrs.get("Internal")),
        "subnet": ipam.get("Subnet"),
        "gateway": ipam.get("Gateway"),
    }
    if adopted is not None:
        outputs["adopted"] = adopted
    return outputs


class NetworkKind(DockerKind):
    name = "docker.network"
    description = (
        "A Docker network (g-<name>-<id8>). Containers on it reach each other by their record names. "
        "Deleting it while containers still use it is retried until they are gone."
    )
    spec_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "driver": {"type": "string", "minLength": 1, "default": "bridge"},
            "internal": {"type": "boolean", "default": False, "description": "no route to the outside"},
            "subnet": {"type": "string", "pattern": r"^[0-9a-fA-F.:]+/\d{1,3}$", "description": "e.g. 10.77.0.0/24"},
            "options": {"type": "object", "additionalProperties": {"type": "string"}},
            "agent": AGENT_PROPERTY,
        },
        "additionalProperties": False,
    }

    def _find(self, record: Record) -> Any | None:
        with translate_errors(f"list the networks of record {record.pk}"):
            found = client().networks.list(filters=record_filter(record))
        return found[0] if found else None

    @on_engine("create")
    def create(self, record: Record) -> dict[str, Any]:
        existing = self._find(record)
        if existing is not None:
            return _outputs(existing, adopted=True)
        spec = record.spec
        name = object_name(record.name, str(record.pk))
        ipam = None
        if spec.get("subnet"):
            ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=spec["subnet"])])
        with translate_errors(f"create network {name}"):
            try:
                network = client().networks.create(
                    name,
                    driver=spec.get("driver", "bridge"),
                    internal=bool(spec.get("internal", False)),
                    options=spec.get("options") or None,
                    ipam=ipam,
                    labels=labels_for(record, self.name),
                    check_duplicate=True,  # a second network of the same name is never made
                )
            except docker.errors.APIError as exc:
                if not is_conflict(exc):
                    raise
                # The name is taken: ours (a create that died before we could list it) or a stranger's.
                return _outputs(claim(record, client().networks.get(name), f"network {name}"), adopted=True)
        with translate_errors(f"inspect network {name}"):
            network.reload()
        return _outputs(network, adopted=False)

    @on_engine("observe")
    def observe(self, record: Record) -> Observed | None:
        network = self._find(record)
        return Observed(_outputs(network)) if network is not None else None

    def diff(self, record: Record, observed: Observed) -> list[Drift]:
        spec, actual = record.spec, observed.outputs
        drifts = []
        if actual.get("driver") != spec.get("driver", "bridge"):
            drifts.append(Drift("driver", spec.get("driver", "bridge"), actual.get("driver")))
        if actual.get("internal") != bool(spec.get("internal", False)):
            drifts.append(Drift("internal", bool(spec.get("internal", False)), actual.get("internal")))
        if spec.get("subnet") and actual.get("subnet") != spec["subnet"]:
            drifts.append(Drift("subnet", spec["subnet"], actual.get("subnet")))
        return drifts

    @on_engine("delete")
    def delete(self, record: Record) -> None:
        with translate_errors(f"list the networks of record {record.pk}"):
            found = client().networks.list(filters=record_filter(record))
        for network in found:
            self._remove(network.id)

    def _remove(self, network_id: str) -> None:
        try:
            with translate_errors(f"remove network {network_id[:12]}"):  # in use (403/409): retried
                client().networks.get(network_id).remove()
        except docker.errors.NotFound:
            return

    def sweep(self) -> Iterable[Marked]:
        found = list_or_nothing(self.name, lambda: client().networks.list(filters=sweep_filter(self.name)))
        return list(sweep_marked(found, id_of=lambda n: str(n.id)))

    def delete_external(self, external_id: str) -> None:
        self._remove(external_id)
