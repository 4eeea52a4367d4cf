"""Containers made from a spec: what ``docker.container`` and ``docker.job`` share.

Adopt-or-create (I4): the record's containers are found by the ``graphene.record`` label.
One made from the current spec (same ``graphene.spec`` hash) is adopted; any other (a
duplicate, or one made from an older generation of the spec) is removed. Only if none is
left is a container created, already carrying the labels, under the record's name.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import docker.errors
import docker.types
import docker.utils
from graphene_sdk.libs.docker import object_name

from kinds import KindError, PermanentError, string_or_secret
from kinds.docker._common import (
    AGENT_PROPERTY,
    LABEL_RECORD,
    LABEL_SPEC,
    claim,
    client,
    is_conflict,
    labels_for,
    record_filter,
    spec_hash,
    sweep_filter,
    translate_errors,
)

if TYPE_CHECKING:
    from apps.records.models import Record

# Spec fields that say how to wait or fetch, not what the container is: changing them does
# not replace a container.
NOT_SHAPING = frozenset({"ready_when", "ready_timeout_s", "timeout_s", "pull"})
BUILTIN_NETWORKS = frozenset({"bridge", "host", "none", "default"})
_ALIAS = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}")

ENV_VALUE_SCHEMA = string_or_secret(
    "a value, or a secret reference {'$secret': name} resolved when the container is made"
)
ARGV_SCHEMA = {"type": "array", "items": {"type": "string"}}

WORKLOAD_PROPERTIES: dict[str, Any] = {
    "image": {
        "type": "string",
        "minLength": 1,
        "description": "an image reference present on (or pullable by) dockerd",
    },
    "command": ARGV_SCHEMA,
    "entrypoint": ARGV_SCHEMA,
    "env": {"type": "object", "additionalProperties": ENV_VALUE_SCHEMA},
    "network": {
        "type": "string",
        "minLength": 1,
        "description": "a network's name (a docker.network's g-<name>-<id8>)",
    },
    "volumes": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "source": {"type": "string", "minLength": 1, "description": "a volume name, or an absolute host path"},
                "target": {"type": "string", "pattern": "^/", "description": "absolute path in the container"},
                "read_only": {"type": "boolean", "default": False},
            },
            "required": ["source", "target"],
            "additionalProperties": False,
        },
    },
    "workdir": {"type": "string", "pattern": "^/"},
    "user": {"type": "string", "minLength": 1},
    "pull": {"enum": ["missing", "never"], "default": "missing", "description": "pull the image if it is missing"},
    "agent": AGENT_PROPERTY,
}


def container_outputs(container: Any, *, adopted: bool | None = None) -> dict[str, Any]:
    attrs = container.attrs
    state = attrs.get("State") or {}
    settings = attrs.get("NetworkSettings") or {}
    networks = {name: (net or {}).get("IPAddress") or None for name, net in (settings.get("Networks") or {}).items()}
    ports = {
        port: [{"host_ip": b.get("HostIp"), "host_port": int(b["HostPort"])} for b in bindings if b.get("HostPort")]
        for port, bindings in (settings.get("Ports") or {}).items()
        if bindings
    }
    outputs = {
        "id": attrs.get("Id"),
        "name": str(attrs.get("Name", "")).lstrip("/"),
        "image": (attrs.get("Config") or {}).get("Image"),
        "image_id": attrs.get("Image"),
        "status": state.get("Status"),
        "running": bool(state.get("Running")),
        "health": (state.get("Health") or {}).get("Status"),
        "exit_code": state.get("ExitCode"),
        "started_at": state.get("StartedAt"),
        "restart_count": attrs.get("RestartCount", 0),
        "ip_address": next((ip for ip in networks.values() if ip), None),
        "networks": networks,
        "ports": ports,
    }
    if adopted is not None:
        outputs["adopted"] = adopted
    return outputs


def find(record: Record) -> list[Any]:
    """The record's containers (any state), oldest first."""
    with translate_errors(f"list the containers of record {record.pk}"):
        found = client().containers.list(all=True, filters=record_filter(record), ignore_removed=True)
    return sorted(found, key=lambda c: str(c.attrs.get("Created", "")))


def image_id(reference: str) -> str | None:
    """The id the reference names on the docker host now (``None``: not there)."""
    try:
        with translate_errors(f"inspect image {reference}"):
            return str(client().images.get(reference).id)
    except docker.errors.NotFound:
        return None


def ensure_image(spec: dict[str, Any]) -> None:
    reference = spec["image"]
    if image_id(reference) is not None:
        return
    if spec.get("pull", "missing") == "never":
        raise KindError(f"image {reference} is not on the docker host (pull: never); import or pull it first")
    repository, tag = docker.utils.parse_repository_tag(reference)
    try:
        with translate_errors(f"pull image {reference}"):
            client().images.pull(repository, tag=tag or "latest")
    except docker.errors.NotFound as exc:
        # Retryable: a docker.image of the same run may still be importing it.
        raise KindError(f"image {reference} is not on the docker host and cannot be pulled: {exc.explanation}") from exc


def ensure_volumes(spec: dict[str, Any]) -> None:
    """Named volumes must exist: dockerd would quietly make a missing one, unlabelled, and the
    docker.volume record that was to make it would then find a stranger's volume."""
    for mount in spec.get("volumes") or []:
        source = mount["source"]
        if source.startswith("/"):
            continue
        try:
            with translate_errors(f"inspect volume {source}"):
                client().volumes.get(source)
        except docker.errors.NotFound:
            raise KindError(f"volume {source} does not exist (yet); declare it with docker.volume") from None


def remove(container: Any) -> None:
    """Remove a container (killed first if it runs) with its anonymous volumes; gone is fine."""
    try:
        with translate_errors(f"remove container {container.name}"):
            container.remove(force=True, v=True)
    except docker.errors.NotFound:
        return


def remove_by_id(container_id: str) -> None:
    try:
        with translate_errors(f"remove container {container_id[:12]}"):
            client().api.remove_container(container_id, force=True, v=True)
    except docker.errors.NotFound:
        return


def sweep_containers(kind: str) -> list[tuple[str, str]]:
    """(container id, record id) of the installation's containers made by ``kind``."""
    with translate_errors(f"list {kind} containers"):
        found = client().api.containers(all=True, filters=sweep_filter(kind))
    return [(c["Id"], (c.get("Labels") or {}).get(LABEL_RECORD, "")) for c in found]


def _create_kwargs(record: Record, kind: str, spec: dict[str, Any], digest: str) -> dict[str, Any]:
    from apps.core.errors import GrapheneError
    from apps.secrets.services import secret_refs_resolve

    try:
        # Values of secret references are read here, handed to dockerd and dropped (I7).
        env = secret_refs_resolve(spec.get("env") or {}, namespace=record.namespace)
    except GrapheneError as exc:
        raise PermanentError(f"cannot read the container's environment: {exc.detail}") from exc
    kwargs: dict[str, Any] = {
        "image": spec["image"],
        "name": object_name(record.name, str(record.pk)),
        "labels": labels_for(record, kind, digest),
        "detach": True,
    }
    if "command" in spec:
        kwargs["command"] = spec["command"]
    if "entrypoint" in spec:
        kwargs["entrypoint"] = spec["entrypoint"]
    if env:
        kwargs["environment"] = env
    if spec.get("workdir"):
        kwargs["working_dir"] = spec["workdir"]
    if spec.get("user"):
        kwargs["user"] = spec["user"]
    if spec.get("volumes"):
        kwargs["mounts"] = [
            docker.types.Mount(
                target=v["target"],
                source=v["source"],
                type="bind" if v["source"].startswith("/") else "volume",
                read_only=bool(v.get("read_only", False)),
            )
            for v in spec["volumes"]
        ]
    network = spec.get("network")
    if network:
        kwargs["network"] = network
        if network not in BUILTIN_NETWORKS and _ALIAS.fullmatch(record.name):
            # Others on the network reach this container by its record name ("db").
            kwargs["networking_config"] = {network: client().api.create_endpoint_config(aliases=[record.name])}
    if spec.get("ports"):
        kwargs["ports"] = {
            f"{p['container']}/{p.get('protocol', 'tcp')}": {
                "HostIp": p.get("host_ip", "127.0.0.1"),
                "HostPort": "" if p.get("host") is None else str(p["host"]),
            }
            for p in spec["ports"]
        }
    check = spec.get("healthcheck")
    if check:
        kwargs["healthcheck"] = {
            "test": check["test"],
            "interval": int(check.get("interval_s", 5) * 1e9),
            "timeout": int(check.get("timeout_s", 5) * 1e9),
            "retries": int(check.get("retries", 3)),
            "start_period": int(check.get("start_period_s", 0) * 1e9),
        }
    restart = spec.get("restart", "no")
    if restart != "no":
        kwargs["restart_policy"] = {"Name": restart}
    return kwargs


def adopt_or_create(record: Record, kind: str, *, replace_on_image_change: bool) -> tuple[Any, bool]:
    """The record's container made from its current spec: adopted if there is one, else created.

    ``replace_on_image_change``: also replace an adopted container whose image is no longer
    what the spec's reference names (the tag moved): how a long-running container heals.
    """
    spec = record.spec
    digest = spec_hash(spec, NOT_SHAPING)
    keep = None
    for container in find(record):
        same = (container.labels or {}).get(LABEL_SPEC) == digest
        if same and replace_on_image_change:
            current = image_id(spec["image"])
            same = current is None or current == container.attrs.get("Image")
        if keep is None and same:
            keep = container
        else:
            remove(container)  # a duplicate, or made from another spec or image: ours to remove
    if keep is not None:
        return keep, True
    ensure_image(spec)
    ensure_volumes(spec)
    kwargs = _create_kwargs(record, kind, spec, digest)
    name = kwargs["name"]
    with translate_errors(f"create container {name}"):
        try:
            return client().containers.create(**kwargs), False
        except docker.errors.NotFound as exc:
            # Typically a network declared in the same run that is not there yet: retried.
            raise KindError(f"cannot create container {name}: {exc.explanation}") from exc
        except docker.errors.APIError as exc:
            if not is_conflict(exc):
                raise
            # The name is taken: by our container (listed too late), or by a stranger's.
            taken = claim(record, client().containers.get(name), f"container {name}")
            return taken, True


def ensure_started(container: Any) -> None:
    status = (container.attrs.get("State") or {}).get("Status")
    with translate_errors(f"start container {container.name}"):
        if status == "paused":
            container.unpause()
        elif status in ("created", "exited"):
            container.start()
        container.reload()
