"""Handles a pipeline holds: declared resources, attached records, agents' machines (exec,
files, functions), and the needs an agent must meet."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from graphene_sdk._artifacts import ArtifactRef
from graphene_sdk._errors import ResourceFailed
from graphene_sdk._remote import (
    MAX_GET_FILE_BYTES,
    MAX_PUT_FILE_BYTES,
    file_content,
    file_mode,
    remote_call,
    remote_path,
)
from graphene_sdk._runtime import Guarantee, Runtime
from graphene_sdk._secrets import SecretRef

if TYPE_CHECKING:
    pass

T = TypeVar("T")


def _exec_env(env: Mapping[str, str | SecretRef] | None) -> dict[str, str | dict[str, str]]:
    """An exec's environment as it travels: strings, and secret references in their JSON
    form (``{"$secret": name}``), read on the server where the command is stored."""
    clean: dict[str, str | dict[str, str]] = {}
    for key, value in (env or {}).items():
        if isinstance(value, SecretRef):
            clean[str(key)] = value.to_json()
        elif isinstance(value, str):
            clean[str(key)] = value
        else:
            raise TypeError(
                f"env[{key!r}] is a {type(value).__name__}: exec's env values are strings or ctx.secret(...) references"
            )
    return clean


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
        env: Mapping[str, str | SecretRef] | None = None,
        cwd: str | None = None,
        timeout: timedelta | float | None = None,
        guarantee: Guarantee = "at_least_once",
    ) -> ExecResult:
        """Run ``argv`` on the machine; the run suspends until it ends (output streams to the log).

        ``env`` values may be ``ctx.secret(...)`` references, as a Docker job's may: only the
        name travels (journal, events, logs); the value is read on the server when the
        command is stored, which is then kept encrypted until it is sent (a missing secret
        fails the call, naming it).

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
            _exec_env(env),
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
