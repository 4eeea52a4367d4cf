"""``graphenectl account`` (service accounts and their tokens) and ``graphenectl token`` (your own).

A token's key is printed once, by the command that creates it, alone on stdout (``-o json``:
``{key, id, expires_at}``); the server keeps only its digest, so it can never be shown again.
Lists show a token's first characters (``grt_AbCd1234``), its status and expiry. A token is
named on the command line by its id or by those first characters (or the whole key: a leaked
key can be revoked as it was found).
"""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Annotated, Any

import typer
from graphene_sdk.validation import dns_label_problem

from graphenectl._errors import NotFoundError, UsageError
from graphenectl._options import NamespaceOpt, OutputOpt
from graphenectl._output import Column, Format, TableWriter, emit, info, note, to_json, to_yaml, warn, write
from graphenectl._session import session
from graphenectl._time import age, parse_duration, ttl

VISIBLE_CHARS = 12  # what a list shows of a key (the server's VISIBLE_CHARS)


class KeyFormat(StrEnum):
    text = "text"
    json = "json"
    yaml = "yaml"


KeyOutputOpt = Annotated[
    KeyFormat,
    typer.Option(
        "--output",
        "-o",
        case_sensitive=False,
        help="text: the key alone (default) | json | yaml: {key, id, expires_at}",
    ),
]
ExpiresInOpt = Annotated[
    str | None,
    typer.Option(
        "--expires-in",
        help="how long the token is valid: 30d, 12h, 90m (default: the server's, 90 days unless configured)",
    ),
]
CommentOpt = Annotated[str, typer.Option("--comment", help="what the token is for (shown in lists)")]


def _checked(value: str, *, what: str) -> str:
    """``value`` if it is a DNS label (the server's rule, from the SDK); else a usage error."""
    problem = dns_label_problem(value)
    if problem is not None:
        raise UsageError(f"{what} {problem}", fields={what: [problem]})
    return value


def _ns(namespace: str | None) -> dict[str, str]:
    """The one namespace an account command acts in: -n, else GRAPHENE_NAMESPACE or the
    context's, else 'default' (the server lists accounts one namespace at a time)."""
    session.choose(namespace=namespace)
    return {"namespace": _checked(session.create_namespace(), what="namespace")}


def _token_body(expires_in: str | None, comment: str) -> dict[str, Any]:
    body: dict[str, Any] = {"comment": comment}
    if expires_in:
        body["expires_in_seconds"] = parse_duration(expires_in, option="--expires-in")
    return body


def _print_key(issued: dict[str, Any], output: KeyFormat, *, whose: str) -> None:
    """The new key on stdout (alone, or in JSON/YAML), and on stderr that it is shown only now."""
    shown = {"key": issued["key"], "id": issued["id"], "expires_at": issued["expires_at"]}
    if output is KeyFormat.json:
        write(to_json(shown))
    elif output is KeyFormat.yaml:
        write(to_yaml(shown))
    else:
        write(issued["key"])
    note(f"token {issued['prefix']}… (id {issued['id']}) for {whose}, valid until {issued['expires_at']}")
    warn("this is the only time the token is shown: store it now (the server keeps only its digest)")


TOKEN_COLUMNS = [
    Column("ID", lambda t: t["id"]),
    Column("TOKEN", lambda t: f"{t['prefix']}…"),
    Column("STATUS", lambda t: t["status"], styled=True),
    Column("EXPIRES", lambda t: ttl(t["expires_at"]) if t["status"] == "active" else t["expires_at"][:10]),
    Column("LAST-USED", lambda t: age(t.get("last_used_at")) if t.get("last_used_at") else "never"),
    Column("COMMENT", lambda t: t.get("comment") or "-"),
    Column("CREATED", lambda t: age(t["created_at"]), wide=True),
    Column("CREATED-BY", lambda t: t.get("created_by") or "-", wide=True),
    Column("REVOKED", lambda t: t.get("revoked_reason") or "-", wide=True),
]


def _token_name(token: dict[str, Any]) -> str:
    return f"token/{token['id']}"


def _resolve_token(tokens: list[dict[str, Any]], ref: str, *, where: str) -> dict[str, Any]:
    """A token of ``tokens`` by its id, its first characters as lists show them, or its whole key."""
    try:
        wanted = str(uuid.UUID(ref))
    except ValueError:
        ref = ref.strip().removesuffix("…")
        if len(ref) < VISIBLE_CHARS:
            raise UsageError(
                f"{ref!r} names no token: give its id, or its first {VISIBLE_CHARS} characters as the list shows them",
                hint=f"the list: {where}",
            ) from None
        found = [t for t in tokens if t["prefix"] == ref[:VISIBLE_CHARS]]
    else:
        found = [t for t in tokens if t["id"] == wanted]
    if not found:
        raise NotFoundError(f"no token {ref!r}", hint=f"the list: {where}")
    live = [t for t in found if t["status"] == "active"]
    if len(found) > 1 and len(live) != 1:
        ids = ", ".join(t["id"] for t in found)
        raise UsageError(f"{len(found)} tokens start with {ref[:VISIBLE_CHARS]!r} ({ids}); give the id")
    return live[0] if len(found) > 1 else found[0]


# --- account -------------------------------------------------------------------------------------

account_app = typer.Typer(
    name="account",
    help="Service accounts: identities for programs (CI jobs, deploy bots), each with its own expiring tokens.",
    no_args_is_help=True,
)

ACCOUNT_COLUMNS = [
    Column("NAME", lambda a: a["name"]),
    Column("NAMESPACE", lambda a: a["namespace"]),
    Column("STATUS", lambda a: "deleted" if a.get("disabled_at") else "active", styled=True),
    Column("TOKENS", lambda a: a.get("live_tokens", 0)),
    Column("AGE", lambda a: age(a["created_at"])),
    Column("DESCRIPTION", lambda a: a.get("description") or "-"),
    Column("USER", lambda a: a["username"], wide=True),
    Column("CREATED-BY", lambda a: a.get("created_by") or "-", wide=True),
]


def _account_name(account: dict[str, Any]) -> str:
    return f"serviceaccount/{account['name']}"


@account_app.command("create")
def account_create(
    name: Annotated[str, typer.Argument(metavar="NAME", help="a DNS label: lowercase letters, digits and '-'")],
    description: Annotated[str, typer.Option("--description", help="what it is for")] = "",
    namespace: NamespaceOpt = None,
    output: OutputOpt = Format.table,
) -> None:
    """Create a service account: a user of its own (no password, not staff) for a program.

    Then issue it a token with `graphenectl account token NAME`, and bind it a role as any user.
    Needs `create accounts` in the namespace (the admin role there).
    """
    body = {"name": _checked(name, what="name"), "description": description}
    account = session.client().request("POST", "accounts/", params=_ns(namespace), body=body).body
    note(f"service account {account['namespace']}/{account['name']} created (user {account['username']})")
    info(f"give it a token: graphenectl account token {name} --namespace {account['namespace']}")
    emit(account, output, columns=ACCOUNT_COLUMNS, name_of=_account_name)


@account_app.command("list")
def account_list(namespace: NamespaceOpt = None, output: OutputOpt = Format.table) -> None:
    """The namespace's service accounts (deleted ones too) and their live tokens."""
    params = _ns(namespace)
    accounts, _ = session.client().list("accounts/", params, limit=None)
    if not accounts and output in (Format.table, Format.wide):
        info(
            f"no service accounts in namespace {params['namespace']!r}; "
            "create one with `graphenectl account create NAME`"
        )
        return
    emit(accounts, output, columns=ACCOUNT_COLUMNS, name_of=_account_name)


@account_app.command("describe")
def account_describe(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the service account")],
    namespace: NamespaceOpt = None,
    output: OutputOpt = Format.table,
) -> None:
    """A service account and its tokens (ids, first characters, status, expiry; never a key)."""
    client = session.client()
    params = _ns(namespace)
    account = client.get(f"accounts/{_checked(name, what='name')}/", params)
    tokens, _ = client.list(f"accounts/{name}/tokens/", params, limit=None)
    if output in (Format.json, Format.yaml):
        emit({**account, "tokens": tokens}, output, columns=[], name_of=_account_name)
        return
    if output is Format.name:
        write(_account_name(account))
        return
    for label, value in (
        ("Name", account["name"]),
        ("Namespace", account["namespace"]),
        ("User", account["username"]),
        ("Description", account.get("description") or "-"),
        ("Created", f"{account['created_at']} by {account.get('created_by') or '-'}"),
        ("Status", f"deleted at {account['disabled_at']}" if account.get("disabled_at") else "active"),
    ):
        write(f"{label + ':':<13}{value}")
    write("Tokens:" if tokens else "Tokens:      none")
    if tokens:
        TableWriter(TOKEN_COLUMNS, wide=output is Format.wide).write(tokens)


@account_app.command("token")
def account_token(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the service account")],
    expires_in: ExpiresInOpt = None,
    comment: CommentOpt = "",
    namespace: NamespaceOpt = None,
    output: KeyOutputOpt = KeyFormat.text,
) -> None:
    """Issue a token for a service account and print it, once.

    The key goes alone to stdout (pipe it into your CI's secret store); it is never shown again.
    Examples: graphenectl account token ci --expires-in 30d --comment 'github actions' > ci.token
    """
    path = f"accounts/{_checked(name, what='name')}/tokens/"
    params = _ns(namespace)
    issued = session.client().request("POST", path, params=params, body=_token_body(expires_in, comment)).body
    _print_key(issued, output, whose=f"service account {params['namespace']}/{name}")


@account_app.command("revoke")
def account_revoke(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the service account")],
    token: Annotated[
        str | None,
        typer.Argument(metavar="TOKEN", help="the token: its id, or its first characters as lists show them"),
    ] = None,
    all_tokens: Annotated[bool, typer.Option("--all", help="revoke every token of the account")] = False,
    namespace: NamespaceOpt = None,
) -> None:
    """Revoke one token of a service account, or --all of them.

    A revoked token is refused from the next request on, and the websockets it opened are closed.
    """
    if (token is None) == (not all_tokens):
        raise UsageError("name one TOKEN, or pass --all (not both)")
    client = session.client()
    params = _ns(namespace)
    chosen = params["namespace"]
    path = f"accounts/{_checked(name, what='name')}/tokens/"
    if all_tokens:
        revoked = client.request("DELETE", path, params=params).body["revoked_tokens"]
        note(f"revoked {revoked} token(s) of service account {chosen}/{name}")
        return
    assert token is not None
    tokens, _ = client.list(path, params, limit=None)
    found = _resolve_token(tokens, token, where=f"graphenectl account describe {name} --namespace {chosen}")
    done = client.request("DELETE", f"{path}{found['id']}/", params=params).body
    note(f"token {done['prefix']}… (id {done['id']}) of service account {chosen}/{name} revoked")


@account_app.command("delete")
def account_delete(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the service account")],
    namespace: NamespaceOpt = None,
) -> None:
    """Delete a service account: disable it and revoke its tokens at once.

    The account stays listed as deleted, and its name stays taken: what was granted to it by
    name must not pass to a new account.
    """
    params = _ns(namespace)
    body = session.client().request("DELETE", f"accounts/{_checked(name, what='name')}/", params=params).body
    note(
        f"service account {params['namespace']}/{name} deleted at {body['account']['disabled_at']}; "
        f"{body['revoked_tokens']} token(s) revoked"
    )


# --- token (the caller's own) ----------------------------------------------------------------------

token_app = typer.Typer(
    name="token",
    help="Your own API tokens: list them, create one (printed once), revoke one.",
    no_args_is_help=True,
)


@token_app.command("list")
def token_list(output: OutputOpt = Format.table) -> None:
    """Your tokens, newest first; * marks the one this command used."""
    in_use = session.target().token[:VISIBLE_CHARS]
    tokens, _ = session.client().list("tokens/", limit=None)
    if output in (Format.json, Format.yaml, Format.name):
        emit(tokens, output, columns=TOKEN_COLUMNS, name_of=_token_name)
        return
    columns = [Column("", lambda t: "*" if t["prefix"] == in_use else ""), *TOKEN_COLUMNS]
    emit(tokens, output, columns=columns, name_of=_token_name)


@token_app.command("create")
def token_create(
    expires_in: ExpiresInOpt = None,
    comment: CommentOpt = "",
    output: KeyOutputOpt = KeyFormat.text,
) -> None:
    """Create a token for yourself and print it, once.

    For a second machine, or to replace the one in use: log in with the new one, then revoke
    the old one. Service accounts cannot create their own tokens.
    """
    issued = session.client().request("POST", "tokens/", body=_token_body(expires_in, comment)).body
    _print_key(issued, output, whose="you")


@token_app.command("revoke")
def token_revoke(
    token: Annotated[
        str, typer.Argument(metavar="TOKEN", help="the token: its id, or its first characters as lists show them")
    ],
) -> None:
    """Revoke one of your tokens: refused from the next request on, its websockets closed."""
    client = session.client()
    tokens, _ = client.list("tokens/", limit=None)
    found = _resolve_token(tokens, token, where="graphenectl token list")
    done = client.request("DELETE", f"tokens/{found['id']}/").body
    note(f"token {done['prefix']}… (id {done['id']}) revoked")
    if session.target().token[:VISIBLE_CHARS] == done["prefix"]:
        warn("that was the token this command used: log in again with another (`graphenectl login --token-stdin`)")
