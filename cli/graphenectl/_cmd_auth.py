"""``login``, ``whoami`` and the ``ctx`` group (named server + token pairs)."""

from __future__ import annotations

import os
import sys
import urllib.parse
from pathlib import Path
from typing import Annotated, Any

import typer
from graphene_sdk.tls import Trust

from graphenectl import _config
from graphenectl._client import Client, TokenRefused
from graphenectl._errors import CliError, UsageError
from graphenectl._options import OutputOpt
from graphenectl._output import Column, Format, emit, info, note
from graphenectl._session import session


def login(
    server: Annotated[str, typer.Option("--server", "-s", help="the server's URL, e.g. https://127.0.0.1:8000")],
    token_stdin: Annotated[
        bool, typer.Option("--token-stdin", help="read the API token from stdin (keeps it out of shell history)")
    ] = False,
    name: Annotated[str | None, typer.Option("--name", help="the context's name (default: host:port)")] = None,
    ca_file: Annotated[
        Path | None,
        typer.Option(
            "--ca-file",
            help="pin this CA certificate (PEM) for the server: `graphene up` names its <data dir>/tls/ca.pem",
        ),
    ] = None,
    ca_fingerprint: Annotated[
        str | None,
        typer.Option(
            "--ca-fingerprint",
            metavar="SHA256",
            help="pin the server's CA by its SHA-256 fingerprint (printed by `graphene up` and `graphene tls`): "
            "the CA is fetched from the server and kept only if it has this fingerprint",
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option("--insecure", help="allow a plain http:// server: the token and all data travel unencrypted"),
    ] = False,
) -> None:
    """Check a token against a server and save both as a context, which becomes the current one.

    The token is checked with /api/v1/whoami/ first; nothing is saved if the server refuses it.
    `graphene up` prints the admin's token on its first start (and saves it in
    <data dir>/admin-credentials.json), and serves HTTPS with a CA of its own, which the context
    pins: every later request and websocket to this server trusts that CA and nothing else.

      jq -r .token .graphene/admin-credentials.json |
        graphenectl login --server https://127.0.0.1:8000 --ca-file .graphene/tls/ca.pem --token-stdin

    A server whose certificate comes from a CA this machine already trusts needs neither
    --ca-file nor --ca-fingerprint. A plain http:// server needs --insecure.
    """
    url = _config.normalize_server(server)
    trust = _login_trust(url, ca_file=ca_file, ca_fingerprint=ca_fingerprint, insecure=insecure)
    if token_stdin:
        token = sys.stdin.read().strip()
    elif sys.stdin.isatty():
        token = typer.prompt("API token", hide_input=True).strip()
    else:
        raise UsageError("pass the token on stdin with --token-stdin (or run login in a terminal to be asked)")
    if not token:
        raise UsageError("no token was given (stdin was empty)")
    if ca_fingerprint is not None:
        trust = Trust(ca_pem=_config.ca_fetch(url, ca_fingerprint, timeout=session.timeout), source="--ca-fingerprint")
    try:
        who = Client(url, token, timeout=session.timeout, trust=trust).get("whoami/")
    except TokenRefused:
        raise CliError(
            f"{url} refused this token; nothing was saved",
            hint="copy the token again (`graphene up` prints the admin's on first start and keeps it in "
            "<data dir>/admin-credentials.json)",
        ) from None
    except CliError as exc:
        raise CliError(f"{exc.message}; nothing was saved", hint=exc.hint, exit_code=exc.exit_code) from None
    config = _config.load()
    context = name or _config.default_context_name(url)
    config.contexts[context] = _config.ContextEntry(
        name=context, server=url, token=token, user=who["username"], ca=trust.ca_pem, insecure=trust.insecure
    )
    config.current = context
    _config.save(config)
    note(f"logged in to {url} as {who['username']} (server {who.get('server_version')}); context {context!r}")
    if trust.ca_pem:
        info(f"pinned the server's CA {trust.fingerprint}: requests to {url} trust it and nothing else")
    info(f"saved in {config.path}")


def _login_trust(url: str, *, ca_file: Path | None, ca_fingerprint: str | None, insecure: bool) -> Trust:
    """What the new context will trust, from the options (the fingerprint's CA is fetched later)."""
    if urllib.parse.urlsplit(url).scheme == "http":
        if ca_file is not None or ca_fingerprint is not None:
            raise UsageError(f"--ca-file and --ca-fingerprint pin the CA of an https:// server; {url} is plain HTTP")
        if not insecure:
            raise UsageError(
                f"{url} is plain HTTP: the token and everything else would cross the network unencrypted",
                hint=f"use the server's https:// address, or accept plain HTTP with "
                f"`graphenectl login --server {url} --insecure --token-stdin`",
            )
        sys.stderr.write(
            f"graphenectl: WARNING: --insecure: {url} is plain HTTP. The token and everything you send or "
            "read cross the network unencrypted; anyone on the path can read and change them.\n"
        )
        return Trust(source="--insecure", insecure=True)
    if insecure:
        raise UsageError(
            "--insecure is only for plain http:// servers: an https:// server's certificate is always verified",
            hint="pin its CA with --ca-file or --ca-fingerprint",
        )
    if ca_file is not None and ca_fingerprint is not None:
        raise UsageError("pass --ca-file or --ca-fingerprint, not both")
    if ca_file is not None:
        return Trust(ca_pem=_config.ca_file_read(ca_file), source=f"--ca-file {ca_file}")
    return Trust(source="the system's trust store")


WHOAMI_COLUMNS = [
    Column("USER", lambda w: w["username"]),
    Column("STAFF", lambda w: "yes" if w.get("is_staff") else "no"),
    Column("SERVER", lambda w: w["_server"]),
    Column("VERSION", lambda w: w.get("server_version")),
    Column("CONTEXT", lambda w: w["_context"] or "(environment)"),
]


def whoami(output: OutputOpt = Format.table) -> None:
    """Who the token belongs to, on which server (checks that both work)."""
    target = session.target()
    who = session.client().get("whoami/")
    if output in (Format.table, Format.wide):
        emit({**who, "_server": target.server, "_context": target.context}, output, columns=WHOAMI_COLUMNS, name_of=str)
    else:
        emit(who, output, columns=WHOAMI_COLUMNS, name_of=lambda w: f"user/{w['username']}")


# --- ctx -------------------------------------------------------------------------------------

ctx_app = typer.Typer(
    name="ctx",
    help="Contexts: named server + token pairs saved by `login`; one is current.",
    no_args_is_help=True,
)

CTX_COLUMNS = [
    Column("CURRENT", lambda c: "*" if c["current"] else ""),
    Column("NAME", lambda c: c["name"]),
    Column("SERVER", lambda c: c["server"]),
    Column("USER", lambda c: c["user"] or "-"),
]


def _public(entry: _config.ContextEntry, current: str | None) -> dict[str, Any]:
    """A context without its token: output must never carry secrets."""
    return {"name": entry.name, "server": entry.server, "user": entry.user, "current": entry.name == current}


@ctx_app.command("list")
def ctx_list(output: OutputOpt = Format.table) -> None:
    """The saved contexts; * marks the current one."""
    config = _config.load()
    items = [_public(c, config.current) for c in config.contexts.values()]
    if not items and output in (Format.table, Format.wide):
        info(f"no contexts in {config.path}; add one with `{_config.LOGIN_HINT}`")
        return
    emit(items, output, columns=CTX_COLUMNS, name_of=lambda c: f"context/{c['name']}")


@ctx_app.command("use")
def ctx_use(name: Annotated[str, typer.Argument(help="the context to make current")]) -> None:
    """Make NAME the current context."""
    config = _config.load()
    if name not in config.contexts:
        known = ", ".join(sorted(config.contexts)) or "none"
        raise UsageError(f"no context {name!r} (contexts: {known})", hint=_config.LOGIN_HINT)
    config.current = name
    _config.save(config)
    note(f"current context is {name!r} ({config.contexts[name].server})")


@ctx_app.command("show")
def ctx_show(
    name: Annotated[str | None, typer.Argument(help="a context (default: the one in use)")] = None,
    output: OutputOpt = Format.table,
) -> None:
    """Where commands go: the server, user, what its TLS trusts and where each setting comes from (never the token)."""
    config = _config.load()
    if name:
        if name not in config.contexts:
            raise UsageError(f"no context {name!r} (contexts: {', '.join(sorted(config.contexts)) or 'none'})")
        entry = config.contexts[name]
        data = {**_public(entry, config.current), "server_from": f"context {name!r}", "token_from": f"context {name!r}"}
        trust = Trust(ca_pem=entry.ca, source=f"context {name!r}", insecure=entry.insecure)
        data["tls"] = trust.describe() if entry.ca or entry.insecure else "the system's trust store"
    else:
        target = _config.resolve(config, session.context)
        entry_user = config.contexts[target.context].user if target.context else ""
        data = {
            "name": target.context,
            "server": target.server,
            "user": entry_user,
            "current": target.context == config.current,
            "server_from": target.server_from,
            "token_from": target.token_from,
            "tls": target.trust.describe(),
        }
    data["config"] = str(config.path)
    names = (_config.ENV_SERVER, _config.ENV_TOKEN, _config.ENV_CONTEXT, _config.ENV_CA_FILE, _config.ENV_INSECURE)
    overrides = [v for v in names if os.environ.get(v)]
    data["environment_overrides"] = overrides
    if output in (Format.table, Format.wide):
        width = max(len(k) for k in data) + 2
        for key, value in data.items():
            shown = ", ".join(value) if isinstance(value, list) else value
            sys.stdout.write(f"{key + ':':<{width}}{'-' if shown in (None, '') else shown}\n")
    else:
        emit(data, output, columns=CTX_COLUMNS, name_of=lambda c: f"context/{c['name']}")


@ctx_app.command("remove")
def ctx_remove(name: Annotated[str, typer.Argument(help="the context to forget (with its token)")]) -> None:
    """Forget a context and its token."""
    config = _config.load()
    if config.contexts.pop(name, None) is None:
        raise UsageError(f"no context {name!r}")
    if config.current == name:
        config.current = next(iter(config.contexts), None)
    _config.save(config)
    note(f"removed context {name!r}" + (f"; current is now {config.current!r}" if config.current else ""))
