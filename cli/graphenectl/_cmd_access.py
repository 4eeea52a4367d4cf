"""Access: the ``namespace`` and ``role`` groups (namespaces, roles, role bindings).

graphenectl decides nothing here: the server's access module answers every request, and a
refusal prints its detail (who may not do what where, and the ``role bind`` that would allow it).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer
from rich.text import Text

from graphenectl import _config
from graphenectl._errors import UsageError
from graphenectl._listing import listed
from graphenectl._options import AllNamespacesOpt, NamespaceOpt, OutputOpt
from graphenectl._output import Column, Format, TableWriter, emit, info, note, out
from graphenectl._session import session
from graphenectl._time import age

DEFAULT_LIMIT = 100

# The verbs and resources the server's rules speak of: apps/core/access.py VERBS and RESOURCES,
# copied (graphenectl never imports the server; tests/cli/test_access.py keeps them equal). They
# only inform the help: graphenectl checks a rule's syntax, the server its names, so a newer
# server's verbs are not refused by an older graphenectl.
VERBS = (
    "get",
    "list",
    "watch",
    "create",
    "update",
    "delete",
    "start",
    "cancel",
    "resume",
    "exec",
    "open_terminal",
    "read_secret_names",
)
RESOURCES = (
    "records",
    "runs",
    "pipelines",
    "sources",
    "revisions",
    "stands",
    "secrets",
    "agents",
    "artifacts",
    "accounts",
    "audit",
    "rolebindings",
    "namespaces",
    "roles",
    "users",
)
_WORD = re.compile(r"^(\*|[a-z][a-z_]*)$")


def _first_line(text: Any, limit: int = 70) -> str:
    line = str(text or "").strip().splitlines()[0] if str(text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


# --- namespace -------------------------------------------------------------------------------

namespace_app = typer.Typer(
    name="namespace",
    help="Namespaces: the boundaries everything a user names lives in (records, runs, pipelines, "
    "stands, secrets, agents, artifacts). You see those you hold a role binding in.",
    no_args_is_help=True,
)

NAMESPACE_COLUMNS = [
    Column("NAME", lambda n: n["name"]),
    Column("DESCRIPTION", lambda n: _first_line(n.get("description")) or "-"),
    Column("CREATED BY", lambda n: n.get("created_by")),
    Column("AGE", lambda n: age(n.get("created_at"))),
]


def _namespace_name(name: str) -> str:
    if name == _config.EVERY_NAMESPACE:
        raise UsageError("'*' means every namespace in a role binding; a namespace needs a name")
    return _config.check_namespace(name, source="namespace")


@namespace_app.command("list")
def namespace_list(
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many (by name)")] = DEFAULT_LIMIT,
    output: OutputOpt = Format.table,
) -> None:
    """The namespaces you hold a role binding in (every one with a binding in '*'), by name."""
    items = listed("namespaces/", {}, limit=limit, plural="namespaces")
    if not items and output in (Format.table, Format.wide):
        info("no namespaces you hold a role binding in")
        return
    emit(items, output, columns=NAMESPACE_COLUMNS, name_of=lambda n: f"namespace/{n['name']}")


@namespace_app.command("get")
def namespace_get(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the namespace")],
    output: OutputOpt = Format.table,
) -> None:
    """One namespace: its description, who made it and when."""
    body = session.client().get(f"namespaces/{_namespace_name(name)}/")
    emit(body, output, columns=NAMESPACE_COLUMNS, name_of=lambda n: f"namespace/{n['name']}")


@namespace_app.command("create")
def namespace_create(
    name: Annotated[str, typer.Argument(metavar="NAME", help="1-63 lowercase letters, digits and '-'")],
    description: Annotated[str, typer.Option("--description", "-d", help="what (or whose) it is for")] = "",
    output: OutputOpt = Format.name,
) -> None:
    """Make a namespace (needs a role granting 'create namespaces' bound in '*', as admin is).

    Then bind roles in it: graphenectl role bind developer --user bob -n NAME
    """
    body = session.client().post("namespaces/", {"name": _namespace_name(name), "description": description})
    note(f"namespace/{body['name']} created")
    info(f"bind a role in it: graphenectl role bind developer --user USER -n {body['name']}")
    emit(body, output, columns=NAMESPACE_COLUMNS, name_of=lambda n: f"namespace/{n['name']}")


@namespace_app.command("delete")
def namespace_delete(name: Annotated[str, typer.Argument(metavar="NAME", help="an empty namespace")]) -> None:
    """Delete an empty namespace and its role bindings (refused, counting what is left, while it
    holds records, runs, pipelines or secrets; deleted records' tombstones do not count;
    'default' is never deleted)."""
    session.client().request("DELETE", f"namespaces/{_namespace_name(name)}/")
    note(f"namespace/{name} deleted")


# --- role ------------------------------------------------------------------------------------

RULE_HELP = (
    "a rule, VERBS:RESOURCES, each a comma-separated list or * (repeatable; rules add up). "
    f"Verbs: {', '.join(VERBS)}. Resources: {', '.join(RESOURCES)}. "
    "Example: --rule get,list,watch:runs,records --rule start,cancel:runs"
)

role_app = typer.Typer(
    name="role",
    help="Roles (additive rules of verbs by resources) and their bindings to users and groups, per "
    "namespace. Built in: admin, developer, viewer, agent-installer (`graphenectl role get NAME`).",
    no_args_is_help=True,
)


def _rules_text(role: dict[str, Any]) -> str:
    return "; ".join(f"{','.join(r['verbs'])}:{','.join(r['resources'])}" for r in role.get("rules") or [])


ROLE_COLUMNS = [
    Column("NAME", lambda r: r["name"]),
    Column("BUILT IN", lambda r: "yes" if r.get("is_builtin") else "no"),
    Column("DESCRIPTION", lambda r: _first_line(r.get("description"), 80) or "-"),
    Column("RULES", _rules_text, wide=True),
]
RULE_COLUMNS = [
    Column("VERBS", lambda r: ",".join(r["verbs"])),
    Column("RESOURCES", lambda r: ",".join(r["resources"])),
]


def _subject(binding: dict[str, Any]) -> str:
    return f"user/{binding['user']}" if binding.get("user") else f"group/{binding.get('group')}"


BINDING_COLUMNS = [
    Column("ID", lambda b: b["id"]),
    Column("NAMESPACE", lambda b: b["namespace"]),
    Column("ROLE", lambda b: b["role"]),
    Column("SUBJECT", _subject),
    Column("CREATED BY", lambda b: b.get("created_by")),
    Column("AGE", lambda b: age(b.get("created_at"))),
]


def _role_name(name: str) -> str:
    if not _config.NAMESPACE_NAME.match(name):
        raise UsageError(f"role name {name!r}: use 1-63 lowercase letters, digits and '-'")
    return name


def parse_rule(text: str) -> dict[str, list[str]]:
    """``get,list:runs,records`` → ``{"verbs": ["get", "list"], "resources": ["runs", "records"]}``;
    a usage error saying how to write it otherwise (the names are the server's to check)."""
    example = "e.g. get,list:runs,records or *:*"
    verbs_text, sep, resources_text = text.partition(":")
    if not sep or ":" in resources_text:
        raise UsageError(f"--rule {text!r}: write a rule as VERBS:RESOURCES, {example}")
    rule: dict[str, list[str]] = {}
    for key, part in (("verbs", verbs_text), ("resources", resources_text)):
        names = [name.strip() for name in part.split(",")]
        if not part.strip() or any(not name for name in names):
            raise UsageError(f"--rule {text!r}: {key} must be a comma-separated list of names, {example}")
        bad = [name for name in names if not _WORD.match(name)]
        if bad:
            raise UsageError(
                f"--rule {text!r}: {', '.join(map(repr, bad))} cannot be one of the {key} "
                f"(lowercase names, or *); {example}"
            )
        rule[key] = list(dict.fromkeys(names))
    return rule


@role_app.command("list")
def role_list(
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many (by name)")] = DEFAULT_LIMIT,
    output: OutputOpt = Format.table,
) -> None:
    """The roles, built in and custom, by name (-o wide: their rules)."""
    items = listed("roles/", {}, limit=limit, plural="roles")
    emit(items, output, columns=ROLE_COLUMNS, name_of=lambda r: f"role/{r['name']}")


@role_app.command("get")
def role_get(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the role")],
    output: OutputOpt = Format.table,
) -> None:
    """One role: what it is for and its rules, verb by resource."""
    role = session.client().get(f"roles/{_role_name(name)}/")
    if output not in (Format.table, Format.wide):
        emit(role, output, columns=ROLE_COLUMNS, name_of=lambda r: f"role/{r['name']}")
        return
    width = len("Description:") + 2
    for key, value in (
        ("Name:", role["name"]),
        ("Built in:", "yes" if role.get("is_builtin") else "no"),
        ("Description:", role.get("description") or "-"),
    ):
        out.print(Text(key.ljust(width), style="bold") + Text(str(value)))
    out.print(Text("Rules:", style="bold"))
    TableWriter(RULE_COLUMNS, wide=False).write(role.get("rules") or [])


@role_app.command("create")
def role_create(
    name: Annotated[str, typer.Argument(metavar="NAME", help="1-63 lowercase letters, digits and '-'")],
    rule: Annotated[list[str], typer.Option("--rule", "-r", metavar="VERBS:RESOURCES", help=RULE_HELP)],
    description: Annotated[str, typer.Option("--description", "-d", help="what the role is for")] = "",
    output: OutputOpt = Format.name,
) -> None:
    """Make a custom role from rules (needs 'create roles' bound in '*').

    Every rule is checked before anything is sent; the server then checks the verbs and
    resources it names.

    Example: graphenectl role create runner --rule get,list,watch:runs,pipelines --rule start,cancel:runs
    """
    rules = [parse_rule(text) for text in rule]
    body = {"name": _role_name(name), "description": description, "rules": rules}
    role = session.client().post("roles/", body)
    note(f"role/{role['name']} created: {_rules_text(role)}")
    emit(role, output, columns=ROLE_COLUMNS, name_of=lambda r: f"role/{r['name']}")


@role_app.command("delete")
def role_delete(name: Annotated[str, typer.Argument(metavar="NAME", help="a custom role, bound nowhere")]) -> None:
    """Delete a custom role (built-in roles, and roles still bound, are refused)."""
    session.client().request("DELETE", f"roles/{_role_name(name)}/")
    note(f"role/{name} deleted")


@role_app.command("bind")
def role_bind(
    role: Annotated[str, typer.Argument(metavar="ROLE", help="the role to grant")],
    user: Annotated[str | None, typer.Option("--user", "-u", help="grant it to this user")] = None,
    group: Annotated[str | None, typer.Option("--group", "-g", help="grant it to this group's members")] = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace",
            "-n",
            metavar="NS",
            help="where it applies (default: the namespace chosen by GRAPHENE_NAMESPACE or the context, "
            "else 'default'); '*' is every namespace",
            show_default=False,
        ),
    ] = None,
    all_namespaces: Annotated[
        bool, typer.Option("--all-namespaces", help="in every namespace, and the installation-wide resources")
    ] = False,
    output: OutputOpt = Format.table,
) -> None:
    """Grant ROLE to a user or a group in a namespace (or in every one).

    Binding what is bound already changes nothing and says so. Needs 'create rolebindings'
    where the binding applies.

    Examples: graphenectl role bind developer --user bob -n team-a

              graphenectl role bind viewer --group auditors --all-namespaces
    """
    if (user is None) == (group is None):
        raise UsageError("bind to exactly one of --user USER or --group GROUP")
    if namespace is not None and all_namespaces:
        raise UsageError("-n/--namespace and --all-namespaces exclude each other; give one")
    if all_namespaces:
        where = _config.EVERY_NAMESPACE
    elif namespace is not None:
        where = _config.check_namespace(namespace)
    else:
        # Only an explicit '*' binds everywhere: a namespace chosen for reading (-A, or '*' in
        # GRAPHENE_NAMESPACE) must not widen a grant.
        where = session.target().namespace or "default"
    response = session.client().request(
        "POST", "rolebindings/", body={"role": role, "namespace": where, "user": user, "group": group}
    )
    binding = response.body
    scope = "every namespace" if binding["namespace"] == "*" else f"namespace {binding['namespace']!r}"
    what = f"{binding['role']} to {_subject(binding)} in {scope}"
    if response.status == 200:
        note(f"already bound: {what} (rolebinding/{binding['id']})")
    else:
        note(f"bound {what} (rolebinding/{binding['id']})")
    emit(binding, output, columns=BINDING_COLUMNS, name_of=lambda b: f"rolebinding/{b['id']}")


@role_app.command("unbind")
def role_unbind(
    binding: Annotated[str, typer.Argument(metavar="BINDING_ID", help="a binding's id (or rolebinding/<id>)")],
) -> None:
    """Remove a role binding (`graphenectl role bindings` lists them with their ids)."""
    ident = binding.removeprefix("rolebinding/")
    if not ident.isdigit() or len(ident) > 18:
        raise UsageError(f"{binding!r} is not a binding id: they are numbers (graphenectl role bindings lists them)")
    session.client().request("DELETE", f"rolebindings/{ident}/")
    note(f"rolebinding/{ident} removed")


@role_app.command("bindings")
def role_bindings(
    namespace: NamespaceOpt = None,
    all_namespaces: AllNamespacesOpt = False,
    user: Annotated[str | None, typer.Option("--user", "-u", help="only this user's bindings")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many")] = DEFAULT_LIMIT,
    output: OutputOpt = Format.table,
) -> None:
    """Role bindings: in the namespaces where you may list them, and your own anywhere.

    -n '*' lists the bindings made in every namespace; -A (or no namespace chosen) all you may see.
    """
    params: dict[str, Any] = {"user": user}
    if namespace == _config.EVERY_NAMESPACE and not all_namespaces:
        params["namespace"] = _config.EVERY_NAMESPACE
    else:
        session.choose(namespace=namespace, all_namespaces=all_namespaces)
        params["namespace"] = session.list_namespace()
    items = listed("rolebindings/", params, limit=limit, plural="role bindings")
    if not items and output in (Format.table, Format.wide):
        info("no role bindings found")
        return
    emit(items, output, columns=BINDING_COLUMNS, name_of=lambda b: f"rolebinding/{b['id']}")


__all__ = ["namespace_app", "parse_rule", "role_app"]
