"""Install an agent on an existing machine over SSH (``ctx.agent_via_ssh``), idempotently.

* **Host key pinned, no trust on first use.** The caller gives the server's public host key;
  the client knows only that key (paramiko ``RejectPolicy`` plus the pinned key in its host
  keys). A server presenting any other key fails with ``HostKeyMismatch``, naming the host and
  both fingerprints, before anything is authenticated or uploaded. It is never retried.
* **The private key is a secret name.** It is read from the secret store here, at the point
  of use, turned into a paramiko key and dropped; it is never written to a spec, the journal,
  an event or a log line, and no message of this module contains it.
* **Converge, do not repeat.** ``ssh_remote.py`` (sent over the connection, run by the
  machine's ``python3``) reports whether this agent already runs there with the current
  zipapp and settings. If so nothing is issued, uploaded or restarted. Otherwise a fresh
  single-use bootstrap token is issued, the zipapp and a 0600 config are uploaded to
  ``~/.graphene-agent/<agent id>/`` and the agent is started detached (systemd unit, else a
  new session with a pid file), under a lock on the machine so that two concurrent installs
  of one agent start it once. Then the SSH session is closed: from here on the agent's own
  outbound connection is the only one (I8).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import logging
import secrets
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

import paramiko
from django.conf import settings

from apps.agents import services
from apps.core.errors import GrapheneError
from apps.observability.services import log_write
from apps.records.models import Record
from apps.secrets.services import SecretNotFound, secret_resolve

logger = logging.getLogger(__name__)

REMOTE_SCRIPT = Path(__file__).with_name("ssh_remote.py")
REMOTE_PYTHON = "python3"
# The remote steps are short; a step that takes longer than this is stuck (a hung lock, a
# hung systemctl) and fails rather than hold the run's worker forever.
REMOTE_STEP_SECONDS = 120.0


class SSHInstallError(GrapheneError):
    """The install cannot succeed as asked (retrying would not help). ``transient`` errors may."""

    code = "ssh_install_failed"
    transient = False


class HostKeyMismatch(SSHInstallError):
    """The server presented a host key other than the pinned one. Never retried."""

    code = "ssh_host_key_mismatch"


class SSHUnreachable(SSHInstallError):
    """The host did not answer or dropped the connection: worth another attempt later."""

    code = "ssh_unreachable"
    transient = True


@dataclass(frozen=True)
class SSHTarget:
    """Where to install: the machine, the login, the key's *secret name* and the pinned host key."""

    host: str
    port: int
    user: str
    key_secret: str
    host_key: str  # "type base64"

    @classmethod
    def from_call(cls, target: Mapping[str, Any]) -> SSHTarget:
        return cls(
            host=str(target["host"]),
            port=int(target["port"]),
            user=str(target["user"]),
            key_secret=str(target["key"]),
            host_key=str(target["host_key"]),
        )

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def describe(self) -> dict[str, Any]:
        """What may be journaled and shown: everything but secrets (there are none here: only names)."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "key_secret": self.key_secret,
            "host_key_fingerprint": fingerprint(host_key_parse(self.host_key)),
        }


@dataclass(frozen=True)
class InstallOutcome:
    """What the install found or did on the machine."""

    changed: bool  # False: the agent was already running, current; nothing was touched
    pid: int | None
    method: str  # "systemd" or "background"
    directory: str
    host_key_fingerprint: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's fingerprint of a public key: ``SHA256:<base64 without padding>``."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def host_key_parse(text: str) -> paramiko.PKey:
    """The pinned host key from ``"type base64 [comment]"``; ``SSHInstallError`` if it is not one."""
    fields = text.split()
    if len(fields) < 2:
        raise SSHInstallError(f"the pinned host key must be 'type base64', got {text[:80]!r}")
    try:
        return paramiko.PKey.from_type_string(fields[0], base64.b64decode(fields[1], validate=True))
    except Exception as exc:  # binascii.Error, SSHException, UnknownKeyType...: all mean "not a key"
        raise SSHInstallError(f"the pinned host key {fields[0]} {fields[1][:16]}... cannot be read: {exc}") from None


def _private_key(text: str, secret_name: str) -> paramiko.PKey:
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key(io.StringIO(text))
        except Exception:  # noqa: S112 - try the next format; the parser's message could quote the key
            continue
    raise SSHInstallError(
        f"secret {secret_name!r} does not hold a private key that can be used: store an ed25519, ecdsa or rsa "
        "private key (OpenSSH or PEM format) without a passphrase"
    )


def _mismatch(target: SSHTarget, expected: paramiko.PKey, presented: paramiko.PKey) -> HostKeyMismatch:
    return HostKeyMismatch(
        f"host key mismatch for {target.host}:{target.port}: expected {expected.get_name()} {fingerprint(expected)} "
        f"(the pinned host_key), but the server presented {presented.get_name()} {fingerprint(presented)}. "
        "Nothing was sent to it. If the machine's key changed legitimately, verify the new key out of band "
        "and pin it; otherwise something is impersonating the host."
    )


class _PinnedKeyPolicy(paramiko.RejectPolicy):
    """RejectPolicy that says which key was expected and which was presented."""

    def __init__(self, target: SSHTarget, expected: paramiko.PKey) -> None:
        self.target = target
        self.expected = expected

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> NoReturn:
        raise _mismatch(self.target, self.expected, key)


@contextlib.contextmanager
def _session(target: SSHTarget, pkey: paramiko.PKey, expected: paramiko.PKey) -> Iterator[paramiko.SSHClient]:
    timeout = float(settings.GRAPHENE_AGENT_SSH_TIMEOUT_SECONDS)
    client = paramiko.SSHClient()
    # Only the pinned key is known: no system or user known_hosts, no agent, no key files.
    lookup = target.host if target.port == 22 else f"[{target.host}]:{target.port}"
    client.get_host_keys().add(lookup, expected.get_name(), expected)
    client.set_missing_host_key_policy(_PinnedKeyPolicy(target, expected))
    try:
        try:
            client.connect(
                hostname=target.host,
                port=target.port,
                username=target.user,
                pkey=pkey,
                allow_agent=False,
                look_for_keys=False,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                channel_timeout=timeout,
            )
        except paramiko.BadHostKeyException as exc:
            raise _mismatch(target, expected, exc.key) from None
        except paramiko.AuthenticationException:
            raise SSHInstallError(
                f"{target.address} refused the key from secret {target.key_secret!r}: add its public key to "
                f"~{target.user}/.ssh/authorized_keys on {target.host}"
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:  # refused, timed out, reset, banner: try later
            raise SSHUnreachable(f"cannot reach {target.address}: {type(exc).__name__}: {exc}") from None
        yield client
    finally:
        client.close()


def _remote(client: paramiko.SSHClient, target: SSHTarget, args: Sequence[str]) -> dict[str, Any]:
    """Run ``ssh_remote.py`` with ``args`` on the machine; its JSON answer, or ``SSHInstallError``."""
    command = " ".join(shlex.quote(part) for part in [REMOTE_PYTHON, "-", *args])
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise SSHUnreachable(f"the connection to {target.address} was closed during the install")
    try:
        with transport.open_session(timeout=REMOTE_STEP_SECONDS) as channel:
            channel.settimeout(REMOTE_STEP_SECONDS)
            channel.set_combine_stderr(True)  # before the command runs: a traceback is part of the answer
            channel.exec_command(command)
            channel.sendall(REMOTE_SCRIPT.read_bytes())  # the program, on python3's stdin
            channel.shutdown_write()
            chunks = []
            while chunk := channel.recv(65536):
                chunks.append(chunk)
            status = channel.recv_exit_status()
    except (paramiko.SSHException, OSError, EOFError) as exc:  # OSError covers socket timeouts
        raise SSHUnreachable(f"the connection to {target.address} failed during the install: {exc}") from None
    output = b"".join(chunks).decode("utf-8", "replace")
    if status == 127:
        raise SSHInstallError(f"{REMOTE_PYTHON} was not found on {target.host}: the agent needs Python >= 3.9 there")
    lines = [line for line in output.splitlines() if line.startswith("{")]
    try:
        answer: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise SSHInstallError(
            f"the install step on {target.address} exited with status {status}: {output.strip()[-1000:]}"
        ) from None
    if not answer.get("ok"):
        raise SSHInstallError(f"installing on {target.address} failed: {answer.get('error', output.strip()[-1000:])}")
    return answer


def _upload(sftp: paramiko.SFTPClient, path: str, data: bytes, mode: int) -> None:
    with sftp.open(path, "wb") as handle:
        sftp.chmod(path, mode)  # before the content: the config holds the bootstrap token
        handle.write(data)


def agent_ssh_install(
    *, record: Record, target: SSHTarget, server_url: str | None = None, log_to: Sequence[Any] = ()
) -> InstallOutcome:
    """Make the agent of ``record`` run on ``target``: install and start it unless it already runs.

    Idempotent and safe to call again after a crash at any point. Raises ``SSHInstallError``
    (``transient`` for an unreachable host) and ``HostKeyMismatch``. Notes what it did in the
    log of the agent record, which the run that owns it reads, and in those of the records
    in ``log_to`` that do not own it.
    """
    from apps.agents.bundle import agent_bundle

    server = (server_url or settings.GRAPHENE_AGENT_SERVER_URL).rstrip("/")
    expected = host_key_parse(target.host_key)
    try:
        key_text = secret_resolve(name=target.key_secret, namespace=record.namespace)
    except SecretNotFound as exc:
        raise SSHInstallError(f"cannot install agent {record.name} on {target.address}: {exc.detail}") from None
    pkey = _private_key(key_text, target.key_secret)
    del key_text
    bundle = agent_bundle()
    manifest = {
        "agent_id": str(record.pk),
        "server": server,
        # A server whose CA changed gets an agent that trusts the new one: not "current" any more.
        "server_ca": hashlib.sha256(services.agent_server_ca(server_url=server).encode()).hexdigest(),
        "pyz_sha256": bundle.sha256,
        "labels": dict(sorted(record.labels.items())),
    }
    with _session(target, pkey, expected) as client:
        state = _remote(client, target, ["check", json.dumps(manifest, sort_keys=True)])
        if state.get("running") and state.get("current"):
            result = dict(state, changed=False)
        else:
            directory = str(state["dir"])
            token = services.agent_bootstrap_issue(record=record)
            config = services.agent_env_file(record=record, bootstrap_token=token, server_url=server)
            config += f"GRAPHENE_AGENT_STATE_DIR={directory}/state\n"
            nonce = secrets.token_hex(8)
            try:
                with client.open_sftp() as sftp:
                    if not state.get("pyz_current"):
                        _upload(sftp, f"{directory}/.agent.pyz.{nonce}.tmp", bundle.path.read_bytes(), 0o700)
                    _upload(sftp, f"{directory}/.agent.env.{nonce}.tmp", config.encode(), 0o600)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise SSHUnreachable(f"uploading to {target.address} failed: {exc}") from None
            result = _remote(client, target, ["start", json.dumps(manifest, sort_keys=True), nonce])
    outcome = InstallOutcome(
        changed=bool(result.get("changed")),
        pid=result.get("pid"),
        method=str(result.get("method", "")),
        directory=str(result.get("dir", "")),
        host_key_fingerprint=fingerprint(expected),
    )
    if outcome.changed:
        message = (
            f"agent {record.name} installed over SSH on {target.address} (host key {outcome.host_key_fingerprint}): "
            f"started with {outcome.method}, pid {outcome.pid}, in {outcome.directory}"
        )
    else:
        message = (
            f"agent {record.name} already runs on {target.address} (pid {outcome.pid}, {outcome.method}): "
            "nothing was installed"
        )
    logger.info("%s", message)
    for record_id in [record.pk, *services.logs_beyond_subtree(agent_id=record.pk, record_ids=log_to)]:
        log_write(record_id=record_id, message=message, source="ssh-install")
    return outcome
