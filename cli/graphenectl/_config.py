"""Contexts (a server URL and a token, by name) in ``$XDG_CONFIG_HOME/graphene/config.yaml``.

The file holds tokens, so it is written with mode 0600 (atomically: a temporary file in the
same directory, then a rename) inside a 0700 directory. ``GRAPHENE_SERVER`` and
``GRAPHENE_TOKEN`` override the current context's values one by one, which is how CI jobs
use graphenectl without a config file.
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

from graphenectl._errors import CliError, UsageError

ENV_SERVER = "GRAPHENE_SERVER"
ENV_TOKEN = "GRAPHENE_TOKEN"  # noqa: S105 - the variable's name, not a token
ENV_CONTEXT = "GRAPHENE_CONTEXT"

LOGIN_HINT = "graphenectl login --server URL --token-stdin"


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "graphene" / "config.yaml"


@dataclass
class ContextEntry:
    name: str
    server: str
    token: str
    user: str = ""


@dataclass
class Config:
    path: Path
    current: str | None = None
    contexts: dict[str, ContextEntry] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """Where commands go: the resolved server and token, and where each came from."""

    server: str
    token: str
    context: str | None
    server_from: str
    token_from: str


def normalize_server(url: str) -> str:
    """``http://host:8000/api/v1/`` and ``http://host:8000`` name the same server."""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise UsageError(f"server {url!r} is not a URL; pass one like http://127.0.0.1:8000")
    for suffix in ("/api/v1", "/api"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url


def load() -> Config:
    path = config_path()
    config = Config(path=path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        return config
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"cannot read {path}: {exc}", hint="fix or remove the file, then log in again") from None
    if not isinstance(raw, dict):
        raise CliError(f"{path} is not a graphenectl config (expected a mapping)", hint="remove it and log in again")
    config.current = raw.get("current-context") or None
    for item in raw.get("contexts") or []:
        if isinstance(item, dict) and item.get("name"):
            entry = ContextEntry(
                name=str(item["name"]),
                server=str(item.get("server", "")),
                token=str(item.get("token", "")),
                user=str(item.get("user", "")),
            )
            config.contexts[entry.name] = entry
    return config


def save(config: Config) -> None:
    data: dict[str, Any] = {
        "current-context": config.current,
        "contexts": [
            {"name": c.name, "server": c.server, "user": c.user, "token": c.token} for c in config.contexts.values()
        ],
    }
    text = "# graphenectl contexts. It holds API tokens: keep it private (mode 0600).\n" + yaml.safe_dump(
        data, sort_keys=False
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


def resolve(config: Config, context_name: str | None) -> Target:
    """The server and token to use: ``--context``/``GRAPHENE_CONTEXT``, else the current one; env wins."""
    name = context_name or os.environ.get(ENV_CONTEXT) or config.current
    entry: ContextEntry | None = None
    if name:
        entry = config.contexts.get(name)
        if entry is None and (context_name or os.environ.get(ENV_CONTEXT)):
            known = ", ".join(sorted(config.contexts)) or "none"
            raise UsageError(f"no context {name!r} in {config.path} (contexts: {known})", hint=LOGIN_HINT)
    env_server = os.environ.get(ENV_SERVER, "").strip()
    env_token = os.environ.get(ENV_TOKEN, "").strip()
    server = normalize_server(env_server) if env_server else (entry.server if entry else "")
    token = env_token or (entry.token if entry else "")
    where = f"context {entry.name!r}" if entry else "no context"
    if not server:
        raise CliError(
            "no server configured: log in first with `graphenectl login --server URL --token-stdin`, "
            f"or set {ENV_SERVER} and {ENV_TOKEN}"
        )
    if not token:
        raise CliError(
            f"no token for {server}: log in with `graphenectl login --server {server} --token-stdin`, "
            f"or set {ENV_TOKEN}"
        )
    return Target(
        server=server,
        token=token,
        context=entry.name if entry else None,
        server_from=ENV_SERVER if env_server else where,
        token_from=ENV_TOKEN if env_token else where,
    )


def default_context_name(server: str) -> str:
    return urlsplit(server).netloc or server
