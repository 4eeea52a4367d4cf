"""Docker resources: networks, volumes, containers, imported images and one-shot jobs.

Each function builds the spec of a ``docker.*`` kind (``kinds/docker``) and declares it with
``ctx.declare``; the handle comes back at once and the object converges in parallel::

    from graphene_sdk.libs import docker

    net = docker.network(ctx, "net")
    web = docker.container(
        ctx, "web", image="nginx:1.27", network=net, ports={80: None},
        healthcheck=docker.Healthcheck("wget -q -O /dev/null http://127.0.0.1/"), ready_when="healthy",
    )
    address = web.ready()["ip_address"]
    check = docker.job(ctx, "smoke", image="busybox", command=["wget", "-qO-", f"http://{address}/"])
    print(check.ready()["stdout_tail"])

**Referring to another resource.** A spec is fixed when it is declared, before anything
exists, so a handle passed as ``network=``, ``volumes=`` or ``image=`` (a ``Resource``, or
an ``Attached`` one from ``ctx.attach``) is turned into the *deterministic* name of its
object, derived from its record (``object_name`` and ``image_reference`` below; the kinds
use the same functions). The dependant does not wait for its dependency: if the network,
volume or image is not there yet, its create fails with a retryable error and is retried
with backoff until it is (or until the record's create attempts are used up; call
``.ready()`` on the dependency first when it may take longer). To have a container deleted
before its network, declare it with ``parent=net``: owners are deleted after what they own;
otherwise the network's delete is retried while the container still uses it.

**Keeping one.** ``protect=True`` (networks, volumes, containers, images) declares the record
protected: a deletion that reaches it stops there until it is unprotected (a volume of data
that must survive its run, say); see ``ctx.declare``.

**On an agent's machine.** ``on=agent`` (a ``ctx.agent``/``ctx.agent_via_ssh`` handle, or
``ctx.attach_agent``'s) puts the object in the Docker engine of that agent's machine, reached
through the agent's connection (``DOCKER_HOST`` there, else ``/var/run/docker.sock``); the
default ``"server"`` is the engine the Graphene workers reach. On a machine this run declared,
the object is owned by the agent's record unless ``parent`` says otherwise, so it is removed
before the agent goes. Objects that refer to each other (a container and its network) must be
on the same engine. ``image_import``'s ``rootfs_tar`` is still a path on the server: it is
uploaded through the agent (at most 64 MiB).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeAlias

from graphene_sdk._context import Context
from graphene_sdk._handles import Agent, Attached, AttachedAgent, Resource
from graphene_sdk._secrets import SecretRef

__all__ = [
    "Healthcheck",
    "Pull",
    "ReadyWhen",
    "Restart",
    "container",
    "image_import",
    "image_reference",
    "job",
    "network",
    "object_name",
    "volume",
]

ReadyWhen: TypeAlias = Literal["running", "healthy"] | re.Pattern[str]
"""When a container is ready: it runs, its healthcheck passes, or a log line matches the pattern."""
Restart: TypeAlias = Literal["no", "on-failure", "always", "unless-stopped"]
Pull: TypeAlias = Literal["missing", "never"]
OnDrift: TypeAlias = Literal["heal", "report"]
Seconds: TypeAlias = timedelta | float
On: TypeAlias = Agent | AttachedAgent | Literal["server"]
"""Where the object lives: ``"server"`` (the engine Graphene's workers reach) or an agent's machine."""

_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_.-]+")
_REPO_CHARS = re.compile(r"[^a-z0-9]+")
# Docker allows 128+ characters; a short name stays readable in `docker ps`.
_SLUG_MAX = 40


def _id8(record_id: str) -> str:
    return str(record_id).replace("-", "")[:8].lower()


def object_name(name: str, record_id: str) -> str:
    """The Docker name of a record's network, volume or container: ``g-<name>-<first 8 of id>``.

    Characters Docker refuses in names become ``-``; the id part keeps names of different
    records (and of different runs declaring the same name) apart.
    """
    slug = _NAME_CHARS.sub("-", name).strip("-._")[:_SLUG_MAX].strip("-._") or "x"
    return f"g-{slug}-{_id8(record_id)}"


def image_reference(name: str, record_id: str) -> str:
    """The reference of an image imported by a ``docker.image`` record: ``graphene/<name>:<first 8 of id>``."""
    slug = _REPO_CHARS.sub("-", name.lower()).strip("-")[:_SLUG_MAX].strip("-") or "image"
    return f"graphene/{slug}:{_id8(record_id)}"


@dataclass(frozen=True)
class Healthcheck:
    """A container healthcheck. ``test`` as a string runs in ``/bin/sh -c``; as a list, directly."""

    test: str | Sequence[str]
    interval: Seconds = 5.0
    timeout: Seconds = 5.0
    retries: int = 3
    start_period: Seconds = 0.0

    def to_spec(self) -> dict[str, Any]:
        shell = isinstance(self.test, str)
        test = ["CMD-SHELL", str(self.test)] if shell else ["CMD", *(str(part) for part in self.test)]
        return {
            "test": test,
            "interval_s": _seconds(self.interval, "healthcheck interval"),
            "timeout_s": _seconds(self.timeout, "healthcheck timeout"),
            "retries": self.retries,
            "start_period_s": _seconds(self.start_period, "healthcheck start_period", allow_zero=True),
        }


def _seconds(value: Seconds, what: str, *, allow_zero: bool = False) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"{what} must be positive, not {seconds}s")
    return seconds


def _declare(
    ctx: Context,
    kind: str,
    name: str,
    spec: dict[str, Any],
    parent: Resource | None,
    reconcile_every: Seconds | None,
    on_drift: OnDrift | None,
    on: On = "server",
    protect: bool = False,
) -> Resource:
    if isinstance(on, Agent | AttachedAgent):
        spec["agent"] = on.id
        if isinstance(on, Agent) and parent is None:
            parent = on  # removed before the agent goes (an attached agent is not this run's)
    elif on != "server":
        raise ValueError(f"on is 'server' or an agent handle (ctx.agent, ctx.attach_agent...), not {on!r}")
    # Drift options are passed only when given, so the call works with engines (and the
    # testing runtime) that predate them.
    options: dict[str, Any] = {}
    if reconcile_every is not None:
        options["reconcile_every"] = reconcile_every
    if on_drift is not None:
        options["on_drift"] = on_drift
    if protect:  # a deletion stops at it (docs/records.md, "Protected records")
        options["protect"] = True
    return ctx.declare(kind, name, spec, parent=parent, **options)


Ref: TypeAlias = Resource | Attached | str
"""Another record's object: a handle declared by this run, an attached one (``ctx.attach``), or a name."""


def _ref(value: Ref, kind: str, what: str) -> str:
    if isinstance(value, Resource | Attached):
        if value.kind != kind:
            raise TypeError(f"{what} must be a {kind} resource or a name, not a {value.kind} resource")
        return image_reference(value.name, value.id) if kind == "docker.image" else object_name(value.name, value.id)
    if not isinstance(value, str) or not value:
        raise TypeError(f"{what} must be a {kind} resource or a non-empty name")
    return value


def _workload_spec(
    *,
    image: Ref,
    command: Sequence[str] | None,
    entrypoint: Sequence[str] | None,
    env: Mapping[str, str | SecretRef] | None,
    network: Ref | None,
    volumes: Mapping[Ref, str] | None,
    workdir: str | None,
    user: str | None,
    pull: Pull,
) -> dict[str, Any]:
    if isinstance(command, str) or isinstance(entrypoint, str):
        raise TypeError("command and entrypoint are lists of arguments, e.g. ['sh', '-c', 'echo hi']")
    spec: dict[str, Any] = {"image": _ref(image, "docker.image", "image"), "pull": pull}
    if command is not None:
        spec["command"] = [str(arg) for arg in command]
    if entrypoint is not None:
        spec["entrypoint"] = [str(arg) for arg in entrypoint]
    if env:
        # A SecretRef stays a reference ({"$secret": name}, by ctx.declare): the kind reads
        # the value when it creates the container (I7).
        spec["env"] = {str(key): value for key, value in env.items()}
    if network is not None:
        spec["network"] = _ref(network, "docker.network", "network")
    if volumes:
        spec["volumes"] = [
            {"source": _ref(source, "docker.volume", "volume"), "target": target} for source, target in volumes.items()
        ]
    if workdir is not None:
        spec["workdir"] = workdir
    if user is not None:
        spec["user"] = user
    return spec


def _ports_spec(ports: Mapping[int | str, int | None], host_ip: str) -> list[dict[str, Any]]:
    out = []
    for container_port, host_port in ports.items():
        number, _, protocol = str(container_port).partition("/")
        if not number.isdigit():
            raise ValueError(f"container port {container_port!r} must be a number, optionally with /tcp or /udp")
        out.append({"container": int(number), "protocol": protocol or "tcp", "host": host_port, "host_ip": host_ip})
    return out


def network(
    ctx: Context,
    name: str,
    *,
    driver: str = "bridge",
    internal: bool = False,
    subnet: str | None = None,
    options: Mapping[str, str] | None = None,
    parent: Resource | None = None,
    reconcile_every: Seconds | None = None,
    on_drift: OnDrift | None = None,
    protect: bool = False,
    on: On = "server",
) -> Resource:
    """A Docker network (``docker.network``). Containers on it reach each other by record name."""
    spec: dict[str, Any] = {"driver": driver, "internal": internal}
    if subnet is not None:
        spec["subnet"] = subnet
    if options:
        spec["options"] = dict(options)
    return _declare(ctx, "docker.network", name, spec, parent, reconcile_every, on_drift, on, protect)


def volume(
    ctx: Context,
    name: str,
    *,
    driver: str = "local",
    options: Mapping[str, str] | None = None,
    parent: Resource | None = None,
    reconcile_every: Seconds | None = None,
    on_drift: OnDrift | None = None,
    protect: bool = False,
    on: On = "server",
) -> Resource:
    """A named Docker volume (``docker.volume``), deleted with its record."""
    spec: dict[str, Any] = {"driver": driver}
    if options:
        spec["options"] = dict(options)
    return _declare(ctx, "docker.volume", name, spec, parent, reconcile_every, on_drift, on, protect)


def container(
    ctx: Context,
    name: str,
    *,
    image: Ref,
    command: Sequence[str] | None = None,
    entrypoint: Sequence[str] | None = None,
    env: Mapping[str, str | SecretRef] | None = None,
    network: Ref | None = None,
    volumes: Mapping[Ref, str] | None = None,
    ports: Mapping[int | str, int | None] | None = None,
    ports_host_ip: str = "127.0.0.1",
    healthcheck: Healthcheck | str | Sequence[str] | None = None,
    ready_when: ReadyWhen = "running",
    ready_timeout: Seconds = 120.0,
    restart: Restart = "no",
    pull: Pull = "missing",
    workdir: str | None = None,
    user: str | None = None,
    parent: Resource | None = None,
    reconcile_every: Seconds | None = None,
    on_drift: OnDrift | None = None,
    protect: bool = False,
    on: On = "server",
) -> Resource:
    """A long-running container (``docker.container``), ready once ``ready_when`` holds.

    ``ready_when``: ``"running"``, ``"healthy"`` (needs ``healthcheck``) or a compiled
    regular expression that a line of the container's output must match. ``ports`` maps a
    container port (``8080`` or ``"53/udp"``) to a host port (``None``: any free one) bound
    on ``ports_host_ip``; the outputs' ``ports`` say which. ``volumes`` maps a volume (a
    ``docker.volume`` handle or name, or an absolute host path) to a path in the container.
    ``env`` values may be ``ctx.secret(...)`` references.
    """
    spec = _workload_spec(
        image=image,
        command=command,
        entrypoint=entrypoint,
        env=env,
        network=network,
        volumes=volumes,
        workdir=workdir,
        user=user,
        pull=pull,
    )
    if ports:
        spec["ports"] = _ports_spec(ports, ports_host_ip)
    if healthcheck is not None:
        check = healthcheck if isinstance(healthcheck, Healthcheck) else Healthcheck(healthcheck)
        spec["healthcheck"] = check.to_spec()
    if isinstance(ready_when, re.Pattern):
        spec["ready_when"] = {"log": ready_when.pattern}
    elif ready_when in ("running", "healthy"):
        if ready_when == "healthy" and healthcheck is None:
            raise ValueError("ready_when='healthy' needs a healthcheck")
        spec["ready_when"] = ready_when
    else:
        raise ValueError(
            f"ready_when must be 'running', 'healthy' or re.compile(<log line pattern>), not {ready_when!r}"
        )
    spec["ready_timeout_s"] = _seconds(ready_timeout, "ready_timeout")
    spec["restart"] = restart
    return _declare(ctx, "docker.container", name, spec, parent, reconcile_every, on_drift, on, protect)


def image_import(
    ctx: Context,
    name: str,
    *,
    rootfs_tar: str,
    changes: Sequence[str] = (),
    parent: Resource | None = None,
    reconcile_every: Seconds | None = None,
    on_drift: OnDrift | None = None,
    protect: bool = False,
    on: On = "server",
) -> Resource:
    """An image imported from a root file system tar on the Graphene server (``docker import``).

    Its reference is ``image_reference(name, id)``; pass the handle as ``image=`` of a
    container or job. ``changes`` are Dockerfile instructions applied on import
    (``["CMD [\\"/bin/sh\\"]", "ENV A=b"]``).
    """
    if isinstance(changes, str):
        raise TypeError("changes is a list of Dockerfile instructions")
    spec: dict[str, Any] = {"rootfs_tar": rootfs_tar}
    if changes:
        spec["changes"] = [str(change) for change in changes]
    return _declare(ctx, "docker.image", name, spec, parent, reconcile_every, on_drift, on, protect)


def job(
    ctx: Context,
    name: str,
    *,
    image: Ref,
    command: Sequence[str] | None = None,
    entrypoint: Sequence[str] | None = None,
    env: Mapping[str, str | SecretRef] | None = None,
    network: Ref | None = None,
    volumes: Mapping[Ref, str] | None = None,
    timeout: Seconds = 600.0,
    pull: Pull = "missing",
    workdir: str | None = None,
    user: str | None = None,
    parent: Resource | None = None,
    on: On = "server",
) -> Resource:
    """A throwaway container run to completion (``docker.job``); its exit code is the outcome.

    ``ready()`` returns ``{"exit_code": 0, "stdout_tail": "...", ...}``; a non-zero exit (or
    running past ``timeout``) fails the record, with the output's last lines in the error.
    The whole output is in the record's log. A job never drifts, so it takes no drift options.
    """
    spec = _workload_spec(
        image=image,
        command=command,
        entrypoint=entrypoint,
        env=env,
        network=network,
        volumes=volumes,
        workdir=workdir,
        user=user,
        pull=pull,
    )
    spec["timeout_s"] = _seconds(timeout, "timeout")
    return _declare(ctx, "docker.job", name, spec, parent, None, None, on)
