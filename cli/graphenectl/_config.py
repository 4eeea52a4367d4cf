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
    ENV_NAMESPACE,
    ENV_SERVER,
    ENV_TOKEN,
    EVERY_NAMESPACE,
    LOGIN_HINT,
    NAMESPACE_NAME,
    Config,
    ContextEntry,
    Target,
    config_path,
    default_context_name,
    normalize_namespace,
    save,
)
from graphene_sdk.tls import Trust

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


def resolve(config: Config, context_name: str | None, *, namespace: str | None = None) -> Target:
    """The server and token to use: ``--context``/``GRAPHENE_CONTEXT``, else the current one; env wins.
    The namespace: ``namespace`` (``-n``), else ``GRAPHENE_NAMESPACE``, else the context's."""
    try:
        return _sdk.find_target(context=context_name, config=config, namespace=namespace, namespace_from="--namespace")
    except ConfigError as exc:
        raise _cli_error(exc) from None


def trust_for(url: str, *, config: Config, selected: ContextEntry) -> Trust:
    """What connections to ``url`` trust, as for any request to it (``graphene_sdk.config.trust_for``)."""
    try:
        return _sdk.trust_for(url, config=config, selected=selected)
    except ConfigError as exc:
        raise _cli_error(exc) from None


def check_namespace(name: str, *, source: str = "--namespace") -> str:
    """``name`` if it can name a namespace (or is ``*``); a usage error (exit 2) otherwise."""
    try:
        return _sdk.check_namespace(name, source=source)
    except ConfigError as exc:
        raise _cli_error(exc) from None


__all__ = [
    "ENV_CA_FILE",
    "ENV_CONTEXT",
    "ENV_INSECURE",
    "ENV_NAMESPACE",
    "ENV_SERVER",
    "ENV_TOKEN",
    "EVERY_NAMESPACE",
    "LOGIN_HINT",
    "NAMESPACE_NAME",
    "Config",
    "ContextEntry",
    "Target",
    "ca_fetch",
    "ca_file_read",
    "check_namespace",
    "config_path",
    "default_context_name",
    "load",
    "normalize_namespace",
    "normalize_server",
    "resolve",
    "save",
    "trust_for",
]
