"""``audit``: the audit trail (``GET /api/v1/audit/``), newest first, with its filters."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from graphenectl import _config
from graphenectl._options import AllNamespacesOpt, NamespaceOpt, OutputOpt
from graphenectl._output import Column, Format, emit, info
from graphenectl._session import session
from graphenectl._time import parse_time, short_time


def _actor(row: dict[str, Any]) -> str:
    return f"{row.get('actor_kind')}:{row.get('actor_name')}"


def _object(row: dict[str, Any]) -> str:
    return str(row.get("object_name") or row.get("object_id") or "")


AUDIT_COLUMNS = [
    Column("TIME", lambda r: short_time(r.get("created_at"))),
    Column("ACTOR", _actor),
    Column("ACTION", lambda r: r.get("action")),
    Column("OBJECT", _object),
    Column("NAMESPACE", lambda r: r.get("namespace")),
    Column("OBJECT ID", lambda r: r.get("object_id"), wide=True),
    Column("ACTOR ID", lambda r: r.get("actor_id") or "-", wide=True),
    Column("REQUEST", lambda r: r.get("request_id") or "-", wide=True),
    Column("BEFORE", lambda r: (r.get("before_digest") or "-")[:12], wide=True),
    Column("AFTER", lambda r: (r.get("after_digest") or "-")[:12], wide=True),
    Column("DETAIL", lambda r: r.get("detail") or "", wide=True),
]


def _object_id(ref: str) -> str:
    """An object's id as the trail keeps it: ``run/<id>`` and ``record/<id>`` give their id."""
    word, slash, ident = ref.partition("/")
    return ident if slash and word in ("run", "runs", "record", "records", "agent", "agents") and ident else ref


def _namespace(namespace: str | None, all_namespaces: bool) -> str | None:
    """The ``?namespace=`` of the list: the namespace chosen as every listing chooses it (-n,
    GRAPHENE_NAMESPACE, the context's); none with -A or none chosen. The command's own
    ``-n '*'`` asks for the rows of installation-wide objects (namespaces, roles, users, a
    person's tokens), which the trail keeps in ``*``."""
    if namespace == _config.EVERY_NAMESPACE and not all_namespaces:
        return _config.EVERY_NAMESPACE
    session.choose(namespace=namespace, all_namespaces=all_namespaces)
    return session.list_namespace()


def audit(
    namespace: NamespaceOpt = None,
    all_namespaces: AllNamespacesOpt = False,
    actor: Annotated[
        str | None, typer.Option("--actor", help="rows of this actor: a username, pipeline#n, a run's or agent's id")
    ] = None,
    action: Annotated[
        str | None, typer.Option("--action", help="one action (record.create) or a family (record, secret, run)")
    ] = None,
    obj: Annotated[
        str | None, typer.Option("--object", help="rows of this object: an id, run/<id> or record/<id>")
    ] = None,
    since: Annotated[str | None, typer.Option("--since", help="from this long ago (1h, 7d) or an ISO time")] = None,
    until: Annotated[str | None, typer.Option("--until", help="up to this long ago or ISO time")] = None,
    request_id: Annotated[
        str | None, typer.Option("--request-id", help="the rows one request wrote (its X-Request-Id)")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many (newest first)")] = 100,
    output: OutputOpt = Format.table,
) -> None:
    """The audit trail: who changed what, newest first (needs `list audit`: admins).

    Every write leaves a row: the actor (user:NAME, run:PIPELINE#N, agent:NAME, system:TASK), the
    action, the object and its namespace, the request id, and digests of the object before and
    after (-o wide shows them).

    The rows of the namespace chosen (-n, GRAPHENE_NAMESPACE, the context's); with none chosen,
    or -A, of every namespace where you may list the trail. -n '*' shows the rows of
    installation-wide objects (namespaces, roles, users, a person's API tokens).

    Examples: graphenectl audit --since 1h · graphenectl audit --action secret -n team-a ·
    graphenectl audit -A --object run/<id> -o json · graphenectl audit -n '*' --action token
    """
    params = {
        "namespace": _namespace(namespace, all_namespaces),
        "actor": actor,
        "action": action,
        "object": _object_id(obj) if obj else None,
        "since": parse_time(since, option="--since") if since else None,
        "until": parse_time(until, option="--until") if until else None,
        "request_id": request_id,
    }
    rows, more = session.client().list("audit/", {k: v for k, v in params.items() if v}, limit=limit)
    if output in (Format.table, Format.wide) and not rows:
        info("no audit rows match")
        return
    emit(rows, output, columns=AUDIT_COLUMNS, name_of=lambda r: f"audit/{r['id']}")
    if more and output in (Format.table, Format.wide):
        info(f"showing the newest {len(rows)}; more exist (--limit N shows more)")
