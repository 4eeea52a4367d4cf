"""``login``, ``whoami`` and the ``ctx`` group (named server + token pairs)."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer

from graphenectl import _config
from graphenectl._client import Client, TokenRefused
from graphenectl._errors import CliError, UsageError
from graphenectl._options import OutputOpt
from graphenectl._output import Column, Format, emit, info, note
from graphenectl._session import session


def login(
    server: Annotated[str, typer.Option("--server", "-s", help="the server's URL, e.g. http://127.0.0.1:8000")],
    token_stdin: Annotated[
        bool, typer.Option("--token-stdin", help="read the API token from stdin (keeps it out of shell history)")
    ] = False,
    name: Annotated[str | None, typer.Option("--name", help="the context's name (default: host:port)")] = None,
) -> None:
    """Check a token against a server and save both as a context, which becomes the current one.

    The token is checked with /api/v1/whoami/ first; nothing is saved if the server refuses it.
    `graphene up` prints the admin's token on its first start (and saves it in
    <data dir>/admin-credentials.json):

      jq -r .token .graphene/admin-credentials.json | graphenectl login --server http://127.0.0.1:8000 --token-stdin
    """
    url = _config.normalize_server(server)
    if token_stdin:
        token = sys.stdin.read().strip()
    elif sys.stdin.isatty():
        token = typer.prompt("API token", hide_input=True).strip()
    else:
        raise UsageError("pass the token on stdin with --token-stdin (or run login in a terminal to be asked)")
    if not token:
        raise UsageError("no token was given (stdin was empty)")
    try:
        who = Client(url, token, timeout=session.timeout).get("whoami/")
    except TokenRefused:
        raise CliError(
            f"{url} refused this token; nothing was saved",
            hint="copy the token again (`graphene up` prints the admin's on first start and keeps it in "
            "<data dir>/admin-credentials.json)",
        ) from None
    config = _config.load()
    context = name or _config.default_context_name(url)
    config.contexts[context] = _config.ContextEntry(name=context, server=url, token=token, user=who["username"])
    config.current = context
    _config.save(config)
    note(f"logged in to {url} as {who['username']} (server {who.get('server_version')}); context {context!r}")
    info(f"saved in {config.path}")


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
    """Where commands go: the server, user and where each setting comes from (never the token)."""
    config = _config.load()
    if name:
        if name not in config.contexts:
            raise UsageError(f"no context {name!r} (contexts: {', '.join(sorted(config.contexts)) or 'none'})")
        entry = config.contexts[name]
        data = {**_public(entry, config.current), "server_from": f"context {name!r}", "token_from": f"context {name!r}"}
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
        }
    data["config"] = str(config.path)
    overrides = [v for v in (_config.ENV_SERVER, _config.ENV_TOKEN, _config.ENV_CONTEXT) if os.environ.get(v)]
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
