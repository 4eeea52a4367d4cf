"""What a pipeline sees: ``Context`` and ``Resource`` handles.

Both delegate to a runtime: the Graphene engine when a worker executes a run (journaled,
replayable), or the in-memory runtime of ``graphene_sdk.testing``. Pipeline code is the same.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from graphene_sdk._artifacts import ArtifactRef, artifact_name_error
from graphene_sdk._errors import ResourceFailed
from graphene_sdk._remote import (
    MAX_GET_FILE_BYTES,
    MAX_PUT_FILE_BYTES,
    RemoteCall,
    file_content,
    file_mode,
    remote_call,
    remote_path,
)
from graphene_sdk._secrets import SecretRef, encode_secret_refs

if TYPE_CHECKING:
    from pydantic import BaseModel

    from graphene_sdk._pipeline import InputT, OutputT, Pipeline

T = TypeVar("T")
Guarantee = Literal["at_least_once", "at_most_once"]
# How long ``ctx.publish_artifact`` keeps an artifact on the stand unless told otherwise.
DEFAULT_ARTIFACT_LIFETIME = timedelta(days=7)
DriftPolicy = Literal["heal", "report"]


class Runtime(Protocol):
    """The engine side of a Context (not part of the author's API)."""

    run_id: str

    def declare(
        self,
        kind: str,
        name: str,
        spec: Mapping[str, Any],
        labels: Mapping[str, str],
        parent: str | None,
        children: Sequence[str],
        drift: Mapping[str, Any] | None = None,
    ) -> str: ...

    def attach(self, record_id: str) -> tuple[str, str]: ...

    def to_stand(self, record_id: str, label: str, keep_for: float | None) -> None: ...

    def run_children(
        self, pipeline: Pipeline[Any, Any], inputs: Sequence[dict[str, Any]], concurrency: int
    ) -> list[Any]: ...

    def agent(self, name: str, labels: Mapping[str, str], needs: list[dict[str, Any]]) -> str: ...

    def agent_install(self, record_id: str, form: Literal["env", "script"]) -> str: ...

    def agent_via_ssh(self, name: str, labels: Mapping[str, str], target: Mapping[str, Any]) -> str: ...

    def attach_agent(self, name_or_id: str, needs: list[dict[str, Any]]) -> dict[str, Any]: ...

    def select_agents(self, labels: Mapping[str, str], needs: list[dict[str, Any]]) -> list[dict[str, Any]]: ...

    def publish_capability(
        self, record_id: str, label: str, name: str, version: str, labels: Mapping[str, str]
    ) -> None: ...

    def agent_exec(
        self,
        record_id: str,
        label: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None,
        timeout: float | None,
        guarantee: Guarantee,
    ) -> dict[str, Any]: ...

    # put_file/get_file/call are commands like exec: stored, journaled by command id, awaited.
    def agent_put_file(self, record_id: str, label: str, path: str, data: bytes, mode: int) -> dict[str, Any]: ...

    def agent_get_file(self, record_id: str, label: str, path: str, max_bytes: int) -> bytes: ...

    def agent_call(
        self, record_id: str, label: str, call: RemoteCall, timeout: float | None, guarantee: Guarantee
    ) -> Any: ...

    def ready(self, record_id: str, label: str) -> tuple[dict[str, Any] | None, ResourceFailed | None]: ...

    def delete(self, record_id: str, label: str) -> None: ...

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        guarantee: Guarantee,
        timeout: float | None,
        retries: int,
    ) -> Any: ...

    def sleep(self, seconds: float) -> None: ...

    def log(self, message: str, level: str) -> None: ...

    # Artifacts: publish stores the bytes and journals a reference; read is not journaled
    # (an artifact never changes, so a replay reads the same bytes).
    def publish_artifact(
        self, name: str, data: bytes | Path, content_type: str | None, keep_for: float | None, labels: Mapping[str, str]
    ) -> dict[str, Any]: ...

    def attach_artifact(self, name_or_id: str, pipeline: str | None) -> dict[str, Any]: ...

    def read_artifact(self, artifact_id: str) -> bytes: ...


class _Handle:
    __slots__ = ("_runtime", "id", "kind", "name")

    def __init__(self, runtime: Runtime, record_id: str, kind: str, name: str) -> None:
        self._runtime = runtime
        self.id = record_id
        self.kind = kind
        self.name = name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind}/{self.name}, id={self.id})"

    def ready(self) -> dict[str, Any]:
        """The record's outputs once it is ready; raises ``ResourceFailed`` if it cannot be.

        While the record is still converging the run suspends (its worker is released) and
        continues from here when the record changes.
        """
        value, error = self._runtime.ready(self.id, f"{self.kind}/{self.name}")
        if error is not None:
            raise error
        assert value is not None
        return value

    def try_ready(self) -> tuple[dict[str, Any] | None, ResourceFailed | None]:
        """Like ``ready()`` but returns ``(outputs, None)`` or ``(None, error)``."""
        return self._runtime.ready(self.id, f"{self.kind}/{self.name}")


class Resource(_Handle):
    """A handle to a record this run declared (and owns, directly or through ``parent=``).

    Returned at once; the record converges in parallel while the program goes on.
    """

    __slots__ = ()

    def delete(self) -> None:
        """Delete this record and its subtree now (children first), before the run ends."""
        self._runtime.delete(self.id, f"{self.kind}/{self.name}")


@dataclass(frozen=True)
class ExecResult:
    """What a command did on an agent's machine (the full output is in the run's log)."""

    exit_code: int
    stdout_tail: str
    stderr_tail: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class PutFileResult:
    """A file ``Agent.put_file`` wrote on an agent's machine (as the machine reported it)."""

    path: str
    size: int
    sha256: str


class _Machine(_Handle):
    """Commands on an agent's machine: shared by ``Agent`` (declared by this run) and
    ``AttachedAgent`` (a machine this run found, ``ctx.attach_agent``/``ctx.select_agents``)."""

    __slots__ = ()

    def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: timedelta | float | None = None,
        guarantee: Guarantee = "at_least_once",
    ) -> ExecResult:
        """Run ``argv`` on the machine; the run suspends until it ends (output streams to the log).

        A command is stored before it is sent and de-duplicated by the agent, so a replay or
        a reconnect never runs it twice; an at-most-once command whose agent vanished
        mid-flight raises ``OutcomeUnknown``.
        """
        if isinstance(argv, str) or not argv:
            raise ValueError("argv is a non-empty list of strings, e.g. ['make', 'test']")
        result = self._runtime.agent_exec(
            self.id,
            f"{self.kind}/{self.name}",
            [str(a) for a in argv],
            dict(env or {}),
            cwd,
            _seconds(timeout, "timeout"),
            guarantee,
        )
        return ExecResult(
            exit_code=int(result["exit_code"]), stdout_tail=result["stdout_tail"], stderr_tail=result["stderr_tail"]
        )

    def put_file(self, path: str, data: bytes | str | ArtifactRef, *, mode: int = 0o644) -> PutFileResult:
        """Write ``data`` (bytes, a str written as UTF-8, or an artifact's bytes) to the absolute
        ``path`` on the machine.

        The file is replaced atomically (written beside it, then renamed) with ``mode``;
        missing parent directories are created. At most 512 KiB: the content travels in the
        command, one message to the agent, and is stored only until it is delivered (never in
        the run's journal, which keeps the command's id, size and SHA-256); for larger data,
        publish an artifact or fetch it on the machine. The run suspends until the machine
        has written it; a failure (a read-only path, no permission...) raises ``ResourceFailed``.
        """
        target = remote_path(path, "put_file")
        if isinstance(data, ArtifactRef):
            if data.size > MAX_PUT_FILE_BYTES:
                raise ValueError(
                    f"artifact {data.name} is {data.size} bytes; put_file carries at most {MAX_PUT_FILE_BYTES}"
                )
            data = data.read()
        content = file_content(data)
        result = self._runtime.agent_put_file(self.id, f"{self.kind}/{self.name}", target, content, file_mode(mode))
        return PutFileResult(path=target, size=int(result["size"]), sha256=str(result["sha256"]))

    def get_file(self, path: str, *, max_bytes: int = MAX_GET_FILE_BYTES) -> bytes:
        """The content of the absolute ``path`` on the machine (at most ``max_bytes``, 512 KiB).

        A larger file, a missing one or one that cannot be read raises ``ResourceFailed``
        naming the reason (the size, for a larger one). The run suspends until it is read.
        """
        target = remote_path(path, "get_file")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 0 < max_bytes <= MAX_GET_FILE_BYTES:
            raise ValueError(
                f"get_file reads at most {MAX_GET_FILE_BYTES} bytes (512 KiB), so max_bytes is from 1 to that, "
                f"got {max_bytes!r}; for a larger file, compress or split it on the machine with exec"
            )
        return self._runtime.agent_get_file(self.id, f"{self.kind}/{self.name}", target, max_bytes)

    def run(
        self,
        fn: Callable[..., T],
        *args: Any,
        timeout: timedelta | float | None = None,
        guarantee: Guarantee = "at_least_once",
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` on the machine, in a fresh Python process, and return its result.

        What travels is the function's *source*, its name and its arguments as JSON, so:

        * ``fn`` is a plain function defined with ``def`` (at module level, or nested in
          another function as long as it uses none of that function's variables): not a
          lambda, a builtin, a method, a decorated function or a closure;
        * it imports what it needs *inside its body* and uses nothing else of its module:
          the machine runs it with its own Python (the one running the agent, isolated with
          ``-I``), so only the standard library and what is installed there for that Python
          are available; annotations are not evaluated there;
        * arguments and the result are JSON (a tuple arrives as a list, dict keys must be
          strings); the result is returned as JSON, on the first execution as on replay,
          and is at most 512 KiB of it.

        These are checked here, before anything is sent, with errors saying what to change
        (``TypeError``/``ValueError``). An exception raised by ``fn`` on the machine raises
        ``RemoteError`` carrying its type name, message and traceback; a result that is not
        JSON is such an error too. The function's stdout and stderr stream into the run's log
        like ``exec`` output. ``timeout`` kills it (``ResourceFailed``), as does a cancel of
        the run; ``guarantee`` is as for ``exec``. ``timeout`` and ``guarantee`` are options of
        this call: to pass arguments of those names to ``fn``, pass them positionally.
        """
        if guarantee not in ("at_least_once", "at_most_once"):
            raise ValueError("guarantee must be 'at_least_once' or 'at_most_once'")
        call = remote_call(fn, args, kwargs)
        seconds = _seconds(timeout, "timeout")
        if seconds is not None and seconds == 0:
            raise ValueError("timeout must be positive")
        return self._runtime.agent_call(self.id, f"{self.kind}/{self.name}", call, seconds, guarantee)


class Agent(_Machine, Resource):
    """An agent record: a machine that dialled in. Commands are delivered when it connects."""

    __slots__ = ()

    def install_env(self) -> str:
        """An agent config file (0600) with a new single-use bootstrap token. Never journaled."""
        return self._runtime.agent_install(self.id, "env")

    def install_script(self) -> str:
        """A shell script (usable as cloud-init user-data) that installs and starts the agent."""
        return self._runtime.agent_install(self.id, "script")


class Attached(_Handle):
    """A read-only handle to a record this run did not declare (``ctx.attach``).

    It can be waited on and read, but never owns or is owned by this run's records: it is
    not a ``Resource``, so ``parent=``, ``children=`` and ``to_stand`` refuse it, for mypy too.
    """

    __slots__ = ()


class AttachedAgent(_Machine, Attached):
    """A machine this run did not declare (``ctx.attach_agent``, ``ctx.select_agents``).

    Commands run on it as on an ``Agent``, but the run does not own it: it is not deleted when
    the run ends, and it cannot own this run's records (a file on it is owned by the run).
    """

    __slots__ = ()


@dataclass(frozen=True)
class Need:
    """What a pipeline needs of a machine: a published capability, with conditions on it.

    Made by ``need(...)``; ``where_label`` maps a capability label to the value it must have,
    ``where_in`` a label (or ``version``) to the values it may have.
    """

    name: str
    where_label: Mapping[str, str]
    where_in: Mapping[str, tuple[str, ...]]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "where_label": dict(self.where_label),
            "where_in": {k: list(v) for k, v in self.where_in.items()},
        }


def need(
    name: str,
    *,
    where_label: Mapping[str, str] | None = None,
    where_in: Mapping[str, Sequence[str]] | None = None,
) -> Need:
    """A need for ``ctx.attach_agent``/``ctx.select_agents``: the machine publishes capability
    ``name`` (``ctx.publish_capability``), and its labels (or ``version``) match.

    ``need("docker", where_label={"arch": "amd64"}, where_in={"version": ["24", "25"]})``.
    """
    if not isinstance(name, str) or not name or len(name) > 100:
        raise ValueError(f"a need names a capability (1 to 100 characters), got {name!r}")
    labels = dict(where_label or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise TypeError("where_label maps label names to string values, e.g. {'arch': 'amd64'}")
    allowed: dict[str, tuple[str, ...]] = {}
    for key, values in (where_in or {}).items():
        if isinstance(values, str) or not isinstance(key, str):
            raise TypeError(
                "where_in maps label names to lists of values, e.g. {'version': ['24', '25']}; "
                f"got {key!r}: {values!r}"
            )
        items = tuple(values)
        if not items or not all(isinstance(v, str) for v in items):
            raise ValueError(f"where_in[{key!r}] must be a non-empty list of strings")
        allowed[key] = items
    return Need(name=name, where_label=labels, where_in=allowed)


def _needs(needs: Sequence[Need]) -> list[dict[str, Any]]:
    if isinstance(needs, Need) or any(not isinstance(n, Need) for n in needs):
        raise TypeError("needs is a list of need(...) values, e.g. needs=[need('docker')]")
    return [n.to_json() for n in needs]


# Host key types an SSH server presents (the first field of its public key line).
HOST_KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "ssh-rsa",
    }
)


def _host_key(value: str) -> str:
    """``"type base64"`` from a public key line (a trailing comment is dropped), checked."""
    hint = (
        "host_key is the server's public host key as 'type base64', e.g. the content of "
        "/etc/ssh/ssh_host_ed25519_key.pub on that machine, obtained out of band"
    )
    if not isinstance(value, str):
        raise TypeError(f"{hint}; got {type(value).__name__}")
    fields = value.split()
    if len(fields) < 2:
        raise ValueError(f"{hint}; got {value[:80]!r}")
    key_type, data = fields[0], fields[1]
    if key_type not in HOST_KEY_TYPES:
        raise ValueError(f"{hint}; {key_type[:40]!r} is not a host key type ({', '.join(sorted(HOST_KEY_TYPES))})")
    try:
        blob = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{hint}; its second field is not base64") from None
    # The SSH wire format starts with the key type as a length-prefixed string.
    size = int.from_bytes(blob[:4], "big") if len(blob) >= 4 else -1
    if blob[4 : 4 + size].decode("ascii", "replace") != key_type:
        raise ValueError(f"{hint}; the key data is not a {key_type} key")
    return f"{key_type} {data}"


def _seconds(value: timedelta | float | None, what: str) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        raise ValueError(f"{what} must not be negative")
    return seconds


class Context:
    """The run's handle to Graphene: declarations, steps, timers and the run's log."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    @property
    def run_id(self) -> str:
        return self._runtime.run_id

    def log(self, message: str, *, level: str = "info") -> None:
        """Write a line to the run's log (replay does not write it again)."""
        self._runtime.log(str(message), level)

    def declare(
        self,
        kind: str,
        name: str,
        spec: Mapping[str, Any] | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        parent: Resource | None = None,
        children: Sequence[Resource] = (),
        reconcile_every: timedelta | float | None = None,
        on_drift: DriftPolicy = "heal",
    ) -> Resource:
        """Declare a record of ``kind``; returns at once while it converges.

        It is owned by this run, or by ``parent`` (a record this run declared); records in
        ``children`` are given to the new record, which becomes their owner. Resource
        libraries (``graphene_sdk.libs``) are built on this call. A ``ctx.secret(...)`` in
        ``spec`` is stored as ``{"$secret": name}``: the record holds the name, never the value.

        Once ready, the object is observed every ``reconcile_every`` (default: its kind's
        interval); a difference from the spec is healed (re-converged, the default) or, with
        ``on_drift="report"``, only recorded (the record turns ``drifted``).
        """
        if on_drift not in ("heal", "report"):
            raise ValueError(f"on_drift must be 'heal' or 'report', not {on_drift!r}")
        every = _seconds(reconcile_every, "reconcile_every")
        drift: dict[str, Any] = {"on_drift": on_drift}
        if every is not None:
            drift["reconcile_every"] = every
        if parent is not None and not isinstance(parent, Resource):
            raise TypeError("parent must be a Resource declared by this run (an Attached handle cannot own)")
        if any(not isinstance(c, Resource) for c in children):
            raise TypeError("children must be Resources declared by this run (an Attached handle cannot be owned)")
        record_id = self._runtime.declare(
            kind,
            name,
            encode_secret_refs(dict(spec or {})),
            dict(labels or {}),
            parent.id if parent is not None else None,
            [c.id for c in children],
            drift,
        )
        return Resource(self._runtime, record_id, kind, name)

    def agent(self, name: str, *, labels: Mapping[str, str] | None = None, needs: Sequence[Need] = ()) -> Agent:
        """Declare an agent record (a machine this run will act on) and return its handle.

        Install the agent with ``install_script()`` (cloud-init user-data) or ``install_env()``;
        it dials out to Graphene, nothing listens on the machine. The record is ready while
        the agent is connected and, with ``needs``, only once its machine publishes them
        (``ctx.publish_capability``): ``ready()`` waits for both. Commands are delivered as
        soon as it is connected, so a run can install what is needed and then publish it.
        """
        record_id = self._runtime.agent(name, dict(labels or {}), _needs(needs))
        return Agent(self._runtime, record_id, "agent", name)

    def agent_via_ssh(
        self,
        name: str,
        *,
        host: str,
        user: str,
        key: SecretRef,
        host_key: str,
        port: int = 22,
        labels: Mapping[str, str] | None = None,
    ) -> Agent:
        """Declare an agent record, install the agent on ``host`` over SSH, and return once it connected.

        ``key`` names the private key in Graphene's secret store (``ctx.secret("deploy-key")``);
        it is read on the server for the install and never enters the run's journal, events or
        logs. ``host_key`` pins the server's public host key (``"ssh-ed25519 AAAA..."``): there
        is no trust on first use, and a server presenting another key fails the call without
        anything being uploaded. The agent is started detached (a systemd unit where one can
        be installed, else a background process with a pid file) and the SSH session is
        closed: from then on the agent's own outbound connection is the only one.

        The install converges: a replay, a retry or a second call finds the agent running and
        installs nothing again. The run suspends until the agent has connected.
        """
        if not isinstance(key, SecretRef):
            raise TypeError("key must be ctx.secret('<name>'): the private key is stored in Graphene, never passed")
        if not isinstance(host, str) or not host.strip() or any(c.isspace() for c in host):
            raise ValueError(f"host must be a host name or address, got {host!r}")
        if not isinstance(user, str) or not user or any(c.isspace() or c in "@:/" for c in user):
            raise ValueError(f"user must be a login name, got {user!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port must be an integer from 1 to 65535, got {port!r}")
        target = {"host": host, "port": port, "user": user, "key": key.name, "host_key": _host_key(host_key)}
        record_id = self._runtime.agent_via_ssh(name, dict(labels or {}), target)
        return Agent(self._runtime, record_id, "agent", name)

    def attach_agent(self, name: str, *, needs: Sequence[Need] = ()) -> AttachedAgent:
        """A machine that exists already (its agent record, by name or id), to run commands on.

        The run does not own it. Raises ``ResourceFailed`` if no live agent has that name (or
        several do: pass the id), or if its published capabilities do not meet ``needs``
        (the error says what it publishes instead). Journaled: a replay attaches the same one.
        """
        if not isinstance(name, str) or not name:
            raise ValueError("attach_agent takes an agent's name or id")
        found = self._runtime.attach_agent(name, _needs(needs))
        return AttachedAgent(self._runtime, str(found["record_id"]), "agent", str(found["name"]))

    def select_agents(
        self, *, labels: Mapping[str, str] | None = None, needs: Sequence[Need] = ()
    ) -> list[AttachedAgent]:
        """The live machines whose agent labels match ``labels`` and whose capabilities meet
        ``needs``, by name: a snapshot taken once (journaled: a replay gets the same list),
        possibly empty. The run does not own them."""
        labels = dict(labels or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise TypeError("labels maps label names to string values")
        found = self._runtime.select_agents(labels, _needs(needs))
        return [AttachedAgent(self._runtime, str(a["record_id"]), "agent", str(a["name"])) for a in found]

    def publish_capability(
        self,
        agent: Agent | AttachedAgent,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        version: str = "",
    ) -> None:
        """Say that ``agent``'s machine offers ``name`` (e.g. after installing it there), so that
        later runs find it with ``need(name, ...)``; publishing again replaces version and labels."""
        if not isinstance(agent, Agent | AttachedAgent):
            raise TypeError("publish_capability takes an agent handle (ctx.agent, ctx.attach_agent, ...)")
        if not isinstance(name, str) or not name or len(name) > 100:
            raise ValueError(f"a capability name has 1 to 100 characters, got {name!r}")
        if not isinstance(version, str):
            raise TypeError("version is a string, e.g. '24.0'")
        labels = dict(labels or {})
        if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in labels.items()):
            raise TypeError("labels maps label names to string values")
        self._runtime.publish_capability(agent.id, f"{agent.kind}/{agent.name}", name, version, labels)

    def secret(self, name: str) -> SecretRef:
        """A reference to the secret ``name`` in Graphene's store (create it over the API first).

        Only the name is kept wherever the reference goes (specs, the journal, logs); the
        value is read on the server where it is used. Nothing is looked up here: a missing
        secret fails the call that uses it, naming it.
        """
        return SecretRef(name)

    def attach(self, record_id: str) -> Attached:
        """A read-only handle to an existing record (another run's, a stand's) by its id."""
        kind, name = self._runtime.attach(str(record_id))
        return Attached(self._runtime, str(record_id), kind, name)

    def to_stand(self, handle: Resource, *, keep_for: timedelta | None = None) -> None:
        """Give ``handle`` and its subtree to the pipeline's stand, where it outlives this run.

        ``keep_for`` sets its TTL on the stand (extend or release it later); without it the
        subtree stays until someone deletes it.
        """
        if not isinstance(handle, Resource):
            raise TypeError("to_stand takes a Resource declared by this run")
        self._runtime.to_stand(handle.id, f"{handle.kind}/{handle.name}", _seconds(keep_for, "keep_for"))

    def publish_artifact(
        self,
        name: str,
        data: bytes | str | Path,
        *,
        content_type: str | None = None,
        keep_for: timedelta | None = DEFAULT_ARTIFACT_LIFETIME,
        labels: Mapping[str, str] | None = None,
    ) -> ArtifactRef:
        """Store ``data`` in Graphene's blob store as the artifact ``name`` and return a reference.

        ``data`` is bytes, text (stored as UTF-8) or a ``pathlib.Path`` to a file on the worker
        (streamed, never read into memory whole). ``content_type`` defaults to a guess from the
        name (else ``application/octet-stream``). The bytes are stored once per content
        (deduplicated by sha256) and the call is journaled with the reference only: a replay
        after a crash returns the same artifact and stores nothing again.

        Lifetime: the artifact is handed to the pipeline's *stand* at once, with ``keep_for``
        as its TTL (7 days by default; ``None`` keeps it until someone deletes it). Artifacts
        are what a CI run leaves behind for people and later runs (a build, a report), so
        they must outlive the run that made them, whether it succeeded or failed; the stand is
        where Graphene keeps what outlives a run, and the TTL is what deletes it in the end.
        Extend or release it like any stand holding (``graphenectl stand extend``).

        Within one run a name holds one content: publishing the same name again with the same
        bytes returns the same artifact, with other bytes it raises ``ResourceFailed``.
        """
        error = artifact_name_error(name)
        if error is not None:
            raise ValueError(f"artifact name {error}")
        if isinstance(data, str):
            source: bytes | Path = data.encode()
        elif isinstance(data, bytes | bytearray | memoryview):
            source = bytes(data)
        elif isinstance(data, Path):
            source = data  # read by the runtime, and only if the call is not journaled yet
        else:
            raise TypeError(f"data is bytes, str or a pathlib.Path, not {type(data).__name__}")
        if content_type is not None and (not isinstance(content_type, str) or "/" not in content_type):
            raise ValueError(f"content_type is a media type such as 'text/plain', not {content_type!r}")
        seconds = _seconds(keep_for, "keep_for")
        if seconds == 0:
            raise ValueError("keep_for must be positive (None keeps the artifact until it is deleted)")
        result = self._runtime.publish_artifact(name, source, content_type, seconds, dict(labels or {}))
        return ArtifactRef.from_result(result, self._runtime.read_artifact)

    def attach_artifact(self, name_or_id: str, *, pipeline: str | Pipeline[Any, Any] | None = None) -> ArtifactRef:
        """An artifact published earlier: by record id, or the newest of that name held by the
        stand of ``pipeline`` (default: this run's pipeline, so this or an earlier run of it).

        Journaled: a replay returns the same artifact even if a newer one was published
        meanwhile. Raises ``ResourceFailed`` if there is none (or it was deleted).
        """
        if not isinstance(name_or_id, str) or not name_or_id:
            raise ValueError("attach_artifact takes an artifact's name or id")
        name = pipeline if isinstance(pipeline, str) or pipeline is None else pipeline.name
        result = self._runtime.attach_artifact(name_or_id, name)
        return ArtifactRef.from_result(result, self._runtime.read_artifact)

    def run(self, pipeline: Pipeline[InputT, OutputT], inputs: InputT) -> OutputT:
        """Run a child pipeline to its end and return its output; the child dies with this run."""
        return self.run_all(pipeline, [inputs], concurrency=1)[0]

    def run_all(
        self, pipeline: Pipeline[InputT, OutputT], inputs: Sequence[InputT], *, concurrency: int = 4
    ) -> list[OutputT]:
        """Run a child per input, at most ``concurrency`` at once; outputs in input order.

        Raises ``ChildRunFailed`` (after all have ended) if any child did not succeed.
        """
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        for item in inputs:
            if not isinstance(item, pipeline.inputs):
                raise TypeError(f"{pipeline.name} takes {pipeline.inputs.__name__}, not {type(item).__name__}")
        dumped = [item.model_dump(mode="json") for item in inputs]
        outputs = self._runtime.run_children(pipeline, dumped, concurrency)
        model: type[BaseModel] | None = pipeline.output
        results: list[OutputT] = [
            model.model_validate(o) if model is not None and o is not None else o  # type: ignore[misc]
            for o in outputs
        ]
        return results

    def step(
        self,
        name: str,
        fn: Callable[..., T],
        *args: Any,
        guarantee: Guarantee = "at_least_once",
        timeout: timedelta | float | None = None,
        retries: int = 0,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` as a checkpointed step and return its result as JSON.

        The result is journaled as JSON and returned in that form, on the first execution
        as on every replay (a pydantic model comes back as a dict, a tuple as a list), so
        both paths see the same value.

        At-least-once steps run again after a crash mid-step; at-most-once steps raise
        ``OutcomeUnknown`` instead. A completed step is never run again: replay returns the
        journaled result. ``retries`` re-runs a failing step with backoff before it fails.
        """
        if guarantee not in ("at_least_once", "at_most_once"):
            raise ValueError("guarantee must be 'at_least_once' or 'at_most_once'")
        if retries < 0:
            raise ValueError("retries must not be negative")
        seconds = _seconds(timeout, "timeout")
        return self._runtime.step(name, fn, args, kwargs, guarantee, seconds, retries)

    def sleep(self, duration: timedelta | float) -> None:
        """A durable timer: the run suspends and a worker resumes it when the time has come."""
        seconds = _seconds(duration, "duration")
        assert seconds is not None
        self._runtime.sleep(seconds)
