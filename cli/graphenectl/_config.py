"""Contexts: graphenectl resolves its server and token with the SDK's ``graphene_sdk.config``
(the same file, the same ``GRAPHENE_*`` overrides as ``graphene_sdk.Client``); this module
only turns its ``ConfigError`` into graphenectl's errors (a usage error exits 2)."""

from __future__ import annotations

from pathlib import Path

from graphene_sdk import ConfigError
from graphene_sdk import config as _sdk
from graphene_sdk.config import (
    ENV_CA_FILE,
    ENV_CONTEXT,
    ENV_INSECURE,
    ENV_SERVER,
    ENV_TOKEN,
    LOGIN_HINT,
    Config,
    ContextEntry,
    Target,
    config_path,
    default_context_name,
    save,
)

from graphenectl._errors import CliError, UsageError


def _cli_error(exc: ConfigError) -> CliError:
    if exc.is_usage:
        return UsageError(str(exc), hint=exc.hint)
    return CliError(str(exc), hint=exc.hint)


def normalize_server(url: str) -> str:
    """``http://host:8000/api/v1/`` and ``http://host:8000`` name the same server."""
    try:
        return _sdk.normalize_server(url)
    except ConfigError as exc:
        raise _cli_error(exc) from None


def load(path: Path | None = None) -> Config:
    try:
        return _sdk.load(path)
    except ConfigError as exc:
        raise _cli_error(exc) from None


def ca_file_read(path: Path) -> str:
    """The PEM certificate(s) of ``--ca-file``; a usage error naming the file if it is not one."""
    try:
        return _sdk.ca_file_read(path)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def ca_fetch(server: str, fingerprint: str, *, timeout: float) -> str:
    """The server's CA, fetched and kept only if its fingerprint is ``fingerprint`` (``--ca-fingerprint``)."""
    from graphene_sdk import tls

    try:
        return tls.ca_fetch(server, fingerprint, timeout=timeout)
    except ConfigError as exc:
        raise _cli_error(exc) from None


def resolve(config: Config, context_name: str | None) -> Target:
    """The server and token to use: ``--context``/``GRAPHENE_CONTEXT``, else the current one; env wins."""
    try:
        return _sdk.resolve(config, context_name)
    except ConfigError as exc:
        raise _cli_error(exc) from None


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
    "ca_fetch",
    "ca_file_read",
    "config_path",
    "default_context_name",
    "load",
    "normalize_server",
    "resolve",
    "save",
]
