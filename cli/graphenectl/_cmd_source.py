"""``graphenectl source``: git sources of pipeline code, and syncing them into revisions.

A source names a repository, a ref, a sub-directory and (for a private http(s) repository) the
*name* of a secret that holds a token. ``source sync`` asks the server to make a revision of
the commit the ref names now; the server runs git, not graphenectl, so the token never leaves it.
"""

from __future__ import annotations

import urllib.parse
from typing import Annotated, Any

import typer
from graphene_sdk.validation import dns_label_problem
from rich.text import Text

from graphenectl._errors import EXIT_FAILURE, EXIT_USAGE, CliError, UsageError
from graphenectl._listing import namespaced
from graphenectl._options import AllNamespacesOpt, NamespaceOpt, OutputOpt
from graphenectl._output import Column, Format, emit, error_summary, info, note, out, write
from graphenectl._session import session
from graphenectl._time import age

source_app = typer.Typer(
    name="source",
    help="Git sources of pipeline code: a repository at a ref; each sync makes a revision of a new commit "
    "and activates its pipelines.",
    no_args_is_help=True,
)

# A sync runs git and imports the code in a fresh process on the server: it may take a while.
SYNC_TIMEOUT = 600.0


def _short(value: Any, n: int = 12) -> str:
    return str(value)[:n] if value else "-"


def _error_line(source: dict[str, Any]) -> str:
    line = error_summary(str(source.get("error") or ""))
    return (line if len(line) <= 80 else line[:79] + "…") or "-"


SOURCE_COLUMNS = [
    Column("NAME", lambda s: s["name"]),
    Column("URL", lambda s: s["url"]),
    Column("REF", lambda s: s["ref"]),
    Column("COMMIT", lambda s: _short(s.get("commit"))),
    Column("REVISION", lambda s: _short(s.get("revision"))),
    Column("SYNCED", lambda s: age(s.get("synced_at"))),
    Column("STATUS", lambda s: "error" if s.get("error") else "ok" if s.get("revision") else "-", styled=True),
    Column("SUBDIRECTORY", lambda s: s.get("subdirectory") or "-", wide=True),
    Column("CREDENTIAL", lambda s: s.get("credential") or "-", wide=True),
    Column("ACTIVATE", lambda s: "yes" if s.get("activate") else "no", wide=True),
    Column("AGE", lambda s: age(s.get("created_at")), wide=True),
    Column("ERROR", _error_line, wide=True),
]


def _name_of(source: dict[str, Any]) -> str:
    return f"source/{source['name']}"


def _path(name: str, *, action: str = "") -> str:
    """The source's path, its name checked first (the server's rule, from the SDK)."""
    problem = dns_label_problem(name)
    if problem is not None:
        raise UsageError(f"source name {problem}", fields={"name": [problem]})
    return f"sources/{urllib.parse.quote(name)}/" + (f"{action}/" if action else "")


def _describe(source: dict[str, Any]) -> None:
    rows: list[tuple[str, Any]] = [
        ("Name", source["name"]),
        ("Namespace", source.get("namespace")),
        ("URL", source.get("url")),
        ("Ref", source.get("ref")),
        ("Subdirectory", source.get("subdirectory") or "(the repository's root)"),
        ("Credential", f"secret {source['credential']}" if source.get("credential") else "none"),
        ("Activate", "yes: a new revision's pipelines become active" if source.get("activate") else "no: drafts"),
        ("Commit", source.get("commit") or "-"),
        ("Revision", source.get("revision") or "-"),
        ("Synced", f"{age(source.get('synced_at'))} ago" if source.get("synced_at") else "never"),
        ("Created", f"{age(source.get('created_at'))} ago by {source.get('created_by') or 'the system'}"),
    ]
    width = max(len(key) for key, _ in rows) + 2
    for key, value in rows:
        out.print(Text(f"{key}:".ljust(width), style="bold") + Text("-" if value in (None, "") else str(value)))
    if source.get("error"):
        out.print(Text("Error:".ljust(width), style="bold red") + Text(f"{age(source.get('error_at'))} ago"))
        for line in str(source["error"]).rstrip("\n").splitlines():
            out.print(Text("  " + line))


@source_app.command("apply")
def source_apply(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the source's name (a DNS label)")],
    url: Annotated[
        str, typer.Option("--url", help="the repository: https://, http://, git://, ssh:// or file:// (no credentials)")
    ],
    ref: Annotated[str, typer.Option("--ref", help="a branch, a tag, a full ref or a full commit sha")],
    subdirectory: Annotated[
        str, typer.Option("--subdirectory", help="the directory that holds the code (default: the repository's root)")
    ] = "",
    credential: Annotated[
        str,
        typer.Option("--credential", metavar="SECRET", help="a secret of the namespace holding a token (http(s) only)"),
    ] = "",
    activate: Annotated[
        bool,
        typer.Option(
            "--activate/--no-activate",
            help="a new revision's pipelines become active at once (--no-activate: drafts, to activate by hand)",
        ),
    ] = True,
    namespace: NamespaceOpt = None,
    output: OutputOpt = Format.name,
) -> None:
    """Create a git source, or set every setting of an existing one.

    Settings not given take their defaults. Nothing is fetched: `source sync NAME` does that.
    A private http(s) repository takes a token from a secret of the namespace. Examples:

      graphenectl source apply app --url https://git.example.com/org/app.git --ref main --subdirectory ci

      printf %s "$TOKEN" | graphenectl secret set git-token

      graphenectl source apply app --url https://git.example.com/org/app.git --ref main --credential git-token
    """
    session.choose(namespace=namespace)
    _path(name)
    where = session.create_namespace()
    body = {
        "name": name,
        "url": url,
        "ref": ref,
        "subdirectory": subdirectory,
        "credential": credential,
        "activate": activate,
    }
    response = session.client().request("POST", "sources/", params={"namespace": where}, body=body)
    source = response.body
    verb = "created" if response.status == 201 else "configured"
    note(f"source/{source['name']} {verb} in namespace {source.get('namespace', where)!r}")
    if response.status == 201:
        info(f"make its first revision: graphenectl source sync {source['name']}" + _ns_flag(where))
    emit(source, output, columns=SOURCE_COLUMNS, name_of=_name_of)


def _ns_flag(namespace: str) -> str:
    return "" if namespace == "default" else f" -n {namespace}"


@source_app.command("list")
def source_list(
    namespace: NamespaceOpt = None,
    all_namespaces: AllNamespacesOpt = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many")] = 100,
    output: OutputOpt = Format.table,
) -> None:
    """The git sources: repository, ref, what was synced last and when, whether the last sync failed."""
    namespaced(
        "sources/",
        plural="sources",
        columns=SOURCE_COLUMNS,
        name_of=_name_of,
        namespace=namespace,
        all_namespaces=all_namespaces,
        limit=limit,
        output=output,
    )


@source_app.command("get")
def source_get(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the source")],
    namespace: NamespaceOpt = None,
    output: OutputOpt = Format.table,
) -> None:
    """One git source: its settings, what it synced last, and why its last sync failed, if it did."""
    session.choose(namespace=namespace)
    source = session.client().get(_path(name), {"namespace": session.create_namespace()})
    if output in (Format.table, Format.wide):
        _describe(source)
    else:
        emit(source, output, columns=SOURCE_COLUMNS, name_of=_name_of)


@source_app.command("sync")
def source_sync(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the source")],
    namespace: NamespaceOpt = None,
    output: Annotated[
        Format | None,
        typer.Option("--output", "-o", case_sensitive=False, help="json | yaml: the source after the sync"),
    ] = None,
) -> None:
    """Make a revision of the commit the source's ref names now, and activate its pipelines.

    A source applied with --no-activate makes drafts. The same commit as last time changes
    nothing. Prints the commit, the revision's digest, whether it is new, and the pipelines it made
    active. A refused sync (the repository cannot be reached, no such ref, the credential is
    refused, the code does not import or defines no pipeline) prints why and exits 1; the
    pipelines keep their active revisions.
    """
    session.choose(namespace=namespace)
    path = _path(name, action="sync")
    where = session.create_namespace()
    try:
        synced = (
            session.client()
            .request("POST", path, params={"namespace": where}, timeout=max(session.timeout, SYNC_TIMEOUT))
            .body
        )
    except CliError as exc:
        if exc.exit_code != EXIT_USAGE:
            raise
        # A refused sync is not a mistake on the command line: the source's repository or code is
        # the trouble (the server recorded it on the source).
        raise CliError(
            exc.message,
            exit_code=EXIT_FAILURE,
            fields=exc.fields,
            hint=f"graphenectl source get {name}{_ns_flag(where)}",
        ) from None
    if output in (Format.json, Format.yaml, Format.name):
        emit(synced, output, columns=SOURCE_COLUMNS, name_of=_name_of)
        return
    _print_synced(synced)


def _print_synced(synced: dict[str, Any]) -> None:
    """What the sync did, on stdout: one ``key: value`` per line, for people and for grep."""
    activated = synced.get("activated") or []
    rows = [
        ("commit", synced.get("commit") or "-"),
        ("revision", synced.get("revision") or "-"),
        ("new", "yes" if synced.get("new") else "no (the ref still names the commit synced last)"),
        ("pipelines", ", ".join(synced.get("pipelines") or []) or "-"),
        ("activated", ", ".join(activated) or "none"),
    ]
    for key, value in rows:
        write(f"{key}: {value}")
    if synced.get("new"):
        made = "a new revision" if synced.get("revision_created") else "a revision it already had (the same files)"
        note(f"source/{synced['name']} synced: commit {_short(synced.get('commit'))} is {made}")
    else:
        note(f"source/{synced['name']} is up to date at commit {_short(synced.get('commit'))}")


@source_app.command("delete")
def source_delete(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the source")],
    namespace: NamespaceOpt = None,
) -> None:
    """Delete a git source. Its revisions stay, and the pipelines keep their active revisions."""
    session.choose(namespace=namespace)
    where = session.create_namespace()
    session.client().request("DELETE", _path(name), params={"namespace": where})
    note(f"source/{name} deleted from namespace {where!r}")


__all__ = ["source_app"]
