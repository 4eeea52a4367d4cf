"""Configuration: command-line flags over ``GRAPHENE_AGENT_*`` environment over a 0600 env file.

The env file holds the bootstrap token (a secret until it is used), so it must not be
readable or writable by anyone but its owner; the agent refuses to start otherwise.

It also holds ``GRAPHENE_AGENT_SERVER_CA``: the CA certificate the server's certificate must
chain to, as the install data gave it (the PEM body on one line: base64 DER). With it (or
``CA_FILE``) the agent trusts that CA and nothing else for ``wss://``; without either, the
system's trust store.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from graphene_agent.protocol import PATH

PREFIX = "GRAPHENE_AGENT_"
KEYS = (
    "SERVER",  # http(s):// or ws(s):// address of the Graphene server
    "ID",  # the agent record's id (printed by the install data)
    "BOOTSTRAP_TOKEN",  # single-use; exchanged at first connect for a credential
    "STATE_DIR",  # where the credential and the command journal live (0700)
    "LABELS",  # k=v,k=v reported in the hello facts
    "SERVER_CA",  # the CA the server's certificate must chain to: base64 DER, comma-separated if several
    "CA_FILE",  # a CA bundle (PEM file) for wss:// to a server with a private CA
    "BACKOFF_BASE_SECONDS",
    "BACKOFF_MAX_SECONDS",
    "LOG_LEVEL",
)


class ConfigError(Exception):
    """The configuration cannot work; the message says what to fix."""


@dataclass
class Config:
    server: str
    agent_id: str
    state_dir: Path
    bootstrap_token: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    ca_file: str | None = None
    server_ca: bytes = b""  # DER certificate(s) from SERVER_CA
    backoff_base: float = 0.5
    backoff_max: float = 60.0
    log_level: str = "INFO"

    @property
    def websocket_url(self) -> str:
        return websocket_url(self.server)

    @property
    def pinned(self) -> str:
        """What the agent trusts for wss://, for its log lines."""
        parts = []
        if self.server_ca:
            parts.append(f"the CA it was installed with (SHA-256 {self.server_ca_fingerprint})")
        if self.ca_file:
            parts.append(f"the CA file {self.ca_file}")
        return " and ".join(parts) or "the system's trust store"

    @property
    def server_ca_fingerprint(self) -> str:
        """The SHA-256 fingerprint of the (first) installed CA, as ``graphene up`` prints it."""
        if not self.server_ca:
            return ""
        first = ssl_der_first(self.server_ca)
        return ":".join(f"{b:02X}" for b in hashlib.sha256(first).digest())

    @property
    def origin(self) -> str:
        """The server's own origin: the gateway only accepts sockets from allowed hosts."""
        parts = urlsplit(self.websocket_url)
        scheme = "https" if parts.scheme == "wss" else "http"
        return urlunsplit((scheme, parts.netloc, "", "", ""))


def websocket_url(server: str) -> str:
    """``https://host/`` -> ``wss://host/agents/connect`` (a ws(s):// URL with a path is kept)."""
    parts = urlsplit(server.strip())
    schemes = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
    if parts.scheme not in schemes or not parts.netloc:
        raise ConfigError(f"server {server!r} must look like https://host[:port] (or wss://, http://, ws://)")
    path = parts.path.rstrip("/")
    if not path.endswith(PATH):
        path = path + PATH
    return urlunsplit((schemes[parts.scheme], parts.netloc, path, "", ""))


def ssl_der_first(der: bytes) -> bytes:
    """The first certificate of concatenated DER certificates (its length is in its header)."""
    if len(der) < 4 or der[0] != 0x30:
        return der
    if der[1] < 0x80:
        return der[: 2 + der[1]]
    count = der[1] & 0x7F
    length = int.from_bytes(der[2 : 2 + count], "big")
    return der[: 2 + count + length]


def parse_server_ca(text: str) -> bytes:
    """``GRAPHENE_AGENT_SERVER_CA``: base64 DER certificates, comma-separated, as DER bytes."""
    certs = []
    for part in text.split(","):
        part = "".join(part.split())
        if not part:
            continue
        try:
            der = base64.b64decode(part, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{PREFIX}SERVER_CA is not base64 (a certificate's PEM body on one line)") from None
        if not der.startswith(b"\x30"):
            raise ConfigError(f"{PREFIX}SERVER_CA does not hold a certificate (DER)")
        certs.append(der)
    return b"".join(certs)


def check_private(path: Path) -> None:
    """Refuse a file that others may read or write: it carries a secret."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"config file {path} is accessible by other users (mode {stat.S_IMODE(mode):04o}); "
            f"it holds a secret: run `chmod 600 {path}`"
        )


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``#`` comments, optional quotes), as systemd's EnvironmentFile."""
    check_private(path)
    values: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{path}:{number}: expected KEY=VALUE, got {raw!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def parse_labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ConfigError(f"label {part!r} must look like key=value")
        labels[key.strip()] = value.strip()
    return labels


def default_state_dir() -> Path:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/graphene-agent")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "graphene-agent"


def _float(values: Mapping[str, str], key: str, default: float) -> float:
    raw = values.get(key)
    if raw is None or raw == "":
        return default
    try:
        number = float(raw)
    except ValueError:
        raise ConfigError(f"{PREFIX}{key}={raw!r} is not a number") from None
    if number <= 0:
        raise ConfigError(f"{PREFIX}{key} must be positive")
    return number


def load(
    *,
    config_file: Path | None,
    flags: Mapping[str, str | None],
    environ: Mapping[str, str],
    extra_labels: dict[str, str] | None = None,
) -> Config:
    """Merge the sources (flags win, then the environment, then the file) and validate."""
    merged: dict[str, str] = {}
    if config_file is not None:
        for key, value in read_env_file(config_file).items():
            if key.startswith(PREFIX):
                merged[key[len(PREFIX) :]] = value
    for key in KEYS:
        if PREFIX + key in environ:
            merged[key] = environ[PREFIX + key]
    for key, flag in flags.items():
        if flag is not None:
            merged[key] = flag
    server = merged.get("SERVER", "")
    if not server:
        raise ConfigError(f"no server: set {PREFIX}SERVER in the config file or pass --server")
    agent_id = merged.get("ID", "")
    if not agent_id:
        raise ConfigError(f"no agent id: set {PREFIX}ID in the config file or pass --agent-id")
    try:
        agent_id = str(uuid.UUID(agent_id))
    except ValueError:
        raise ConfigError(f"agent id {agent_id!r} is not a UUID") from None
    websocket_url(server)  # validates
    labels = parse_labels(merged.get("LABELS", ""))
    labels.update(extra_labels or {})
    return Config(
        server=server,
        agent_id=agent_id,
        state_dir=Path(merged.get("STATE_DIR") or default_state_dir()).expanduser(),
        bootstrap_token=merged.get("BOOTSTRAP_TOKEN") or None,
        labels=labels,
        ca_file=merged.get("CA_FILE") or None,
        server_ca=parse_server_ca(merged.get("SERVER_CA", "")),
        backoff_base=_float(merged, "BACKOFF_BASE_SECONDS", 0.5),
        backoff_max=_float(merged, "BACKOFF_MAX_SECONDS", 60.0),
        log_level=(merged.get("LOG_LEVEL") or "INFO").upper(),
    )
