"""``graphenectl secret``: names in a namespace's encrypted secret store; values go in, never out.

A value is read from stdin (or a file), never from the command line, which would leave it in
the shell's history and in ``ps`` for every user of the machine to read.
"""

from __future__ import annotations

import sys
import urllib.parse
from pathlib import Path
from typing import Annotated, Any

import typer

from graphenectl._errors import UsageError
from graphenectl._listing import namespaced
from graphenectl._options import AllNamespacesOpt, NamespaceOpt, OutputOpt
from graphenectl._output import Column, Format, emit, note
from graphenectl._session import session
from graphenectl._time import age

secret_app = typer.Typer(
    name="secret",
    help="Secrets: values stored encrypted in a namespace, referenced by name from pipelines (ctx.secret). "
    "Values go in and never come out.",
    no_args_is_help=True,
)

SECRET_COLUMNS = [
    Column("NAME", lambda s: s["name"]),
    Column("UPDATED", lambda s: age(s.get("updated_at"))),
    Column("UPDATED BY", lambda s: s.get("updated_by")),
    Column("CREATED BY", lambda s: s.get("created_by"), wide=True),
    Column("AGE", lambda s: age(s.get("created_at")), wide=True),
    Column("KEY", lambda s: s.get("key_id"), wide=True),
]


def _name_of(secret: dict[str, Any]) -> str:
    return f"secret/{secret['name']}"


def _path(name: str) -> str:
    # The SDK's own rule (the server checks with it too); imported here, not at start-up.
    from graphene_sdk._secrets import secret_name_error

    error = secret_name_error(name)
    if error is not None:
        raise UsageError(f"secret name {error}")
    return f"secrets/{urllib.parse.quote(name)}/"


@secret_app.command("list")
def secret_list(
    namespace: NamespaceOpt = None,
    all_namespaces: AllNamespacesOpt = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many")] = 100,
    output: OutputOpt = Format.table,
) -> None:
    """The secrets' names (with who changed them when), never their values."""
    namespaced(
        "secrets/",
        plural="secrets",
        columns=SECRET_COLUMNS,
        name_of=_name_of,
        namespace=namespace,
        all_namespaces=all_namespaces,
        limit=limit,
        output=output,
    )


@secret_app.command("get")
def secret_get(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the secret")],
    namespace: NamespaceOpt = None,
    output: OutputOpt = Format.table,
) -> None:
    """One secret's name and history (who made and changed it, when), never its value."""
    session.choose(namespace=namespace)
    body = session.client().get(_path(name), {"namespace": session.create_namespace()})
    emit(body, output, columns=SECRET_COLUMNS, name_of=_name_of)


@secret_app.command("set")
def secret_set(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the secret's name")],
    from_file: Annotated[
        Path | None, typer.Option("--from-file", help="read the value from this file (UTF-8 text) instead of stdin")
    ] = None,
    namespace: NamespaceOpt = None,
    output: OutputOpt = Format.name,
) -> None:
    """Store a secret's value, read from stdin or --from-file, as it is (a final newline is kept).

    Makes the secret or replaces its value. Examples:

      printf %s "$DB_PASSWORD" | graphenectl secret set db-password -n team-a

      graphenectl secret set deploy-key --from-file ~/.ssh/deploy_ed25519
    """
    session.choose(namespace=namespace)
    path = _path(name)
    where = session.create_namespace()
    if from_file is not None:
        try:
            value = from_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
            raise UsageError(f"--from-file: cannot read {from_file}: {reason}") from None
    elif sys.stdin.isatty():
        value = typer.prompt(f"value of {name}", hide_input=True)
    else:
        value = sys.stdin.read()
    if not value:
        raise UsageError("the value is empty; nothing was stored (pipe it on stdin or give --from-file)")
    response = session.client().request("PUT", path, params={"namespace": where}, body={"value": value})
    secret = response.body
    verb = "created" if response.status == 201 else "replaced"
    note(f"secret/{secret['name']} {verb} in namespace {secret.get('namespace', where)!r}")
    emit(secret, output, columns=SECRET_COLUMNS, name_of=_name_of)


@secret_app.command("delete")
def secret_delete(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the secret")],
    namespace: NamespaceOpt = None,
) -> None:
    """Delete a secret (pipelines that name it fail where they use it, saying so)."""
    session.choose(namespace=namespace)
    where = session.create_namespace()
    session.client().request("DELETE", _path(name), params={"namespace": where})
    note(f"secret/{name} deleted from namespace {where!r}")


__all__ = ["secret_app"]
