"""Where a client connects: graphenectl's contexts and the ``GRAPHENE_*`` environment.

The one implementation both graphenectl and the SDK's ``Client`` use. A context is a named
server URL and API token, kept in ``$XDG_CONFIG_HOME/graphene/config.yaml`` (default
``~/.config/graphene/config.yaml``); one is current. ``graphenectl login`` writes them.

Resolution (``resolve``): the context named by the caller (``--context``, ``Client(context=)``),
else ``GRAPHENE_CONTEXT``, else the current one; then ``GRAPHENE_SERVER`` and
``GRAPHENE_TOKEN`` override its server and token one by one, which is how CI jobs connect
without a config file. ``Target`` says where each value came from.

TLS (``graphene_sdk.tls``): a context may pin its server's CA (``ca``, the PEM text ``login
--ca-file``/``--ca-fingerprint`` saved) or allow plain HTTP (``insecure``, saved by ``login
--insecure``). The pin belongs to the server: it applies whenever requests go to that server,
whichever context or variable named it. ``GRAPHENE_CA_FILE`` (a PEM file) and
``GRAPHENE_INSECURE=1`` do the same from the environment. An ``http://`` server without that
permission is refused before anything is sent.

The file holds tokens, so it is written with mode 0600 (atomically: a temporary file in the
same directory, then a rename) inside a 0700 directory.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from graphene_sdk._errors import ConfigError
from graphene_sdk.tls import Trust, pem_certificates

__all__ = [
    "ENV_CA_FILE",
    "ENV_CONTEXT",
    "ENV_INSECURE",
    "ENV_SERVER",
    "ENV_TOKEN",
    "LOGIN_HINT",
    "Config",
    "ContextEntry",
    "Target",
    "ca_file_read",
    "config_path",
    "default_context_name",
    "find_target",
    "load",
    "normalize_server",
    "resolve",
    "save",
    "trust_for",
]

ENV_SERVER = "GRAPHENE_SERVER"
ENV_TOKEN = "GRAPHENE_TOKEN"  # noqa: S105 - the variable's name, not a token
ENV_CONTEXT = "GRAPHENE_CONTEXT"
ENV_CA_FILE = "GRAPHENE_CA_FILE"
ENV_INSECURE = "GRAPHENE_INSECURE"

LOGIN_HINT = "graphenectl login --server URL --token-stdin"


def config_path() -> Path:
    """The contexts file: ``$XDG_CONFIG_HOME/graphene/config.yaml`` (``~/.config`` by default)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "graphene" / "config.yaml"


@dataclass
class ContextEntry:
    """One saved context: a server, a token for it, the user the token belongs to, and what
    connections to the server trust: ``ca`` (a pinned CA's PEM; empty: the system's trust
    store) or, for an ``http://`` server, ``insecure``."""

    name: str
    server: str
    token: str = field(repr=False)
    user: str = ""
    ca: str = field(default="", repr=False)
    insecure: bool = False


@dataclass
class Config:
    """The contexts file as read: its path, the current context's name, the contexts by name."""

    path: Path
    current: str | None = None
    contexts: dict[str, ContextEntry] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """Where requests go: the resolved server and token, and where each came from
    (``"context 'prod'"``, ``"GRAPHENE_SERVER"``, ``"argument"``)."""

    server: str
    token: str = field(repr=False)
    context: str | None
    server_from: str
    token_from: str
    trust: Trust = field(default_factory=Trust)


def normalize_server(url: str) -> str:
    """``http://host:8000/api/v1/`` and ``http://host:8000`` name the same server."""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise ConfigError(f"server {url!r} is not a URL; pass one like https://127.0.0.1:8000", is_usage=True)
    for suffix in ("/api/v1", "/api"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url


def load(path: Path | None = None) -> Config:
    """The contexts in ``path`` (default ``config_path()``); none if the file does not exist."""
    path = path or config_path()
    config = Config(path=path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        return config
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", hint="fix or remove the file, then log in again") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} is not a graphenectl config (expected a mapping)", hint="remove it and log in again")
    config.current = raw.get("current-context") or None
    for item in raw.get("contexts") or []:
        if isinstance(item, dict) and item.get("name"):
            entry = ContextEntry(
                name=str(item["name"]),
                server=str(item.get("server", "")),
                token=str(item.get("token", "")),
                user=str(item.get("user", "")),
                ca=str(item.get("ca") or ""),
                insecure=item.get("insecure") is True,
            )
            config.contexts[entry.name] = entry
    return config


class _Dumper(yaml.SafeDumper):
    """Writes a pinned CA's PEM as a literal block, as it looks in its own file."""


_Dumper.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None),
)


def _saved(entry: ContextEntry) -> dict[str, Any]:
    item: dict[str, Any] = {"name": entry.name, "server": entry.server, "user": entry.user, "token": entry.token}
    if entry.ca:
        item["ca"] = entry.ca
    if entry.insecure:
        item["insecure"] = True
    return item


def save(config: Config) -> None:
    """Write ``config`` to its path: mode 0600, atomically, in a 0700 directory."""
    data: dict[str, Any] = {
        "current-context": config.current,
        "contexts": [_saved(c) for c in config.contexts.values()],
    }
    text = "# graphenectl contexts. It holds API tokens: keep it private (mode 0600).\n" + yaml.dump(
        data, Dumper=_Dumper, sort_keys=False
    )
    directory = config.path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    # mkstemp creates the file with mode 0600, so the token is never readable by others, even briefly.
    fd, tmp = tempfile.mkstemp(prefix=".config.", suffix=".yaml", dir=directory)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, config.path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _entry(config: Config, context_name: str | None) -> ContextEntry | None:
    """The context named by the caller, else ``GRAPHENE_CONTEXT``, else the current one."""
    name = context_name or os.environ.get(ENV_CONTEXT) or config.current
    if not name:
        return None
    entry = config.contexts.get(name)
    if entry is None and (context_name or os.environ.get(ENV_CONTEXT)):
        known = ", ".join(sorted(config.contexts)) or "none"
        raise ConfigError(f"no context {name!r} in {config.path} (contexts: {known})", hint=LOGIN_HINT, is_usage=True)
    return entry


def resolve(config: Config, context_name: str | None = None) -> Target:
    """The server and token to use: ``context_name``/``GRAPHENE_CONTEXT``, else the current
    context; ``GRAPHENE_SERVER`` and ``GRAPHENE_TOKEN`` win over its values."""
    return find_target(context=context_name, config=config)


def find_target(
    *,
    server: str | None = None,
    token: str | None = None,
    context: str | None = None,
    config: Config | None = None,
    trust: Trust | None = None,
) -> Target:
    """``resolve``, with values passed explicitly (a ``Client``'s arguments) winning over both
    the environment and the contexts. A server given without a token takes ``GRAPHENE_TOKEN``,
    else the token of a context for that server (the selected one first). ``trust`` (a pinned
    CA, or permission for plain HTTP) wins over ``GRAPHENE_CA_FILE``/``GRAPHENE_INSECURE``,
    which win over what a context for the same server saved."""
    config = config if config is not None else load()
    entry = _entry(config, context)
    env_server = os.environ.get(ENV_SERVER, "").strip()
    env_token = os.environ.get(ENV_TOKEN, "").strip()
    where = f"context {entry.name!r}" if entry else "no context"
    if server:
        url, server_from = normalize_server(server), "argument"
        if entry is None or not _same_server(entry.server, url):
            # The selected context is for another server (its token is not for this one): a
            # context for this server, if one was saved.
            entry = next((c for c in config.contexts.values() if _same_server(c.server, url)), None)
            where = f"context {entry.name!r}" if entry else "no context"
    elif env_server:
        url, server_from = normalize_server(env_server), ENV_SERVER
    else:
        url, server_from = (entry.server if entry else ""), where
    if token:
        key, token_from = token, "argument"
    elif env_token:
        key, token_from = env_token, ENV_TOKEN
    else:
        key, token_from = (entry.token if entry else ""), where
    if not url:
        raise ConfigError(
            "no server configured: log in first with `graphenectl login --server URL --token-stdin`, "
            f"or set {ENV_SERVER} and {ENV_TOKEN}"
        )
    if not key:
        raise ConfigError(
            f"no token for {url}: log in with `graphenectl login --server {url} --token-stdin`, or set {ENV_TOKEN}"
        )
    return Target(
        server=url,
        token=key,
        context=entry.name if entry else None,
        server_from=server_from,
        token_from=token_from,
        trust=trust_for(url, config=config, selected=entry, given=trust),
    )


def trust_for(url: str, *, config: Config, selected: ContextEntry | None = None, given: Trust | None = None) -> Trust:
    """What connections to ``url`` trust: ``given``, else ``GRAPHENE_CA_FILE``/``GRAPHENE_INSECURE``,
    else what a context for this server saved (``selected`` first); for an ``https://`` server
    with no pinned CA, the system's trust store. ``ConfigError`` for an ``http://`` server
    without permission: nothing may be sent to it."""
    https = urlsplit(url).scheme == "https"
    candidates = [given, *_env_trusts()]
    for entry in [selected, *config.contexts.values()]:
        if entry is not None and _same_server(entry.server, url):
            candidates.append(Trust(ca_pem=entry.ca, source=f"context {entry.name!r}", insecure=entry.insecure))
    for trust in candidates:
        if trust is not None and (trust.ca_pem if https else trust.insecure):
            return trust
    if https:
        return Trust(source="the system's trust store")
    raise ConfigError(
        f"{url} is plain HTTP: the token and everything else would cross the network unencrypted. Use its "
        f"https:// address, or accept plain HTTP explicitly: `graphenectl login --server {url} --insecure "
        f"--token-stdin`, graphene_sdk.Client(..., insecure=True), or {ENV_INSECURE}=1",
        is_usage=True,
    )


def _env_trusts() -> list[Trust]:
    trusts = []
    path = os.environ.get(ENV_CA_FILE, "").strip()
    if path:
        trusts.append(Trust(ca_pem=ca_file_read(path, what=f"{ENV_CA_FILE}={path}"), source=ENV_CA_FILE))
    if os.environ.get(ENV_INSECURE, "").strip().lower() in {"1", "true", "yes", "on"}:
        trusts.append(Trust(source=ENV_INSECURE, insecure=True))
    return trusts


def ca_file_read(path: str | os.PathLike[str], *, what: str | None = None) -> str:
    """The PEM certificate(s) in a CA file, checked; ``ConfigError`` naming the file if it cannot be used."""
    what = what or str(path)
    try:
        text = Path(path).expanduser().read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the CA file {what}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return "".join(pem_certificates(text))
    except ValueError as exc:
        raise ConfigError(f"the CA file {what} is not a certificate: {exc}") from None


def _same_server(saved: str, url: str) -> bool:
    try:
        return bool(saved) and normalize_server(saved) == url
    except ConfigError:  # a hand-edited file: that context is simply not this server's
        return False


def default_context_name(server: str) -> str:
    """The name ``graphenectl login`` gives a context when none is passed: ``host:port``."""
    return urlsplit(server).netloc or server
