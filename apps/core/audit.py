"""The audit trail: every write leaves a row saying who did what to which object, in which
namespace, under which request, with digests of the object before and after.

Who acted is told in two ways. Services keep their explicit ``actor=`` (the user who asked;
``None`` when Graphene acts on its own); for ``None`` the row takes the actor from a small
context that each door sets around what it runs:

* HTTP (REST and the Studio): ``AuditContextMiddleware`` (apps/core/middleware.py) — the
  request's user, read when the row is written (DRF authenticates a token inside the view),
  and the request id, which the response returns as ``X-Request-Id``;
* the engine, while it executes a run's code: the run (``"run"``, its id, ``pipeline#n``);
* the agent gateway, for what an agent reports: the agent;
* Celery tasks (beat's periodic tasks, the reconciler, convergence): the system, named after
  the task (graphene_project/celery.py).

Anything else is the system. A service account is a user (its username is recorded).

``audit_write`` inserts the row in the caller's transaction (it refuses to run outside one),
so the change and its row commit or roll back together. On PostgreSQL the table refuses
UPDATE always and DELETE unless the transaction set ``graphene.audit_prune`` (only
``audit_prune``, the retention task, does); see migration ``0003_audit_trail``.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.core.db import is_postgresql
from apps.core.models import AuditActorKind, AuditEntry

# Installation-wide objects (namespaces, roles, bindings in every namespace) are in this
# "namespace": only those granted the audit trail everywhere see their rows.
EVERYWHERE: Final = "*"
SYSTEM_NAME: Final = "graphene"


@dataclass(frozen=True)
class Who:
    """An actor as a row records it: kind (user, run, agent, system), id and a readable name."""

    kind: str
    id: str = ""
    name: str = SYSTEM_NAME


SYSTEM = Who(AuditActorKind.SYSTEM)


def who_user(user: Any) -> Who:
    """A signed-in user (service accounts are users)."""
    return Who(AuditActorKind.USER, str(user.pk), user.get_username())


def who_run(run_id: Any, name: str) -> Who:
    """A run's code, named as its root record is (``pipeline#n``)."""
    return Who(AuditActorKind.RUN, str(run_id), name)


def who_agent(record_id: Any, name: str) -> Who:
    return Who(AuditActorKind.AGENT, str(record_id), name)


def who_system(name: str = SYSTEM_NAME) -> Who:
    """Graphene itself, named after what acted (a task's name)."""
    return Who(AuditActorKind.SYSTEM, "", name[:150] or SYSTEM_NAME)


# --- the context -------------------------------------------------------------------------------

# Who acts here: a Who, or a callable giving one when a row is written (an HTTP request's user,
# known only once the view authenticated it), or None (the system).
_who: ContextVar[Who | Callable[[], Who | None] | None] = ContextVar("graphene_audit_who", default=None)
_request_id: ContextVar[str] = ContextVar("graphene_audit_request_id", default="")

REQUEST_ID_HEADER: Final = "X-Request-Id"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")


def request_id_new() -> str:
    return uuid.uuid4().hex


def request_id_accept(raw: str | None) -> str:
    """The caller's request id when it is a plain token of at most 64 characters (a proxy's or
    a client's, so that their logs and the trail meet), else a new one."""
    if raw and _REQUEST_ID.match(raw):
        return raw
    return request_id_new()


@contextmanager
def acting(who: Who | Callable[[], Who | None] | None, *, request_id: str | None = None) -> Iterator[None]:
    """Rows written inside the block without an explicit actor are ``who``'s (and carry
    ``request_id`` when given)."""
    token = _who.set(who)
    request_token = _request_id.set(request_id) if request_id is not None else None
    try:
        yield
    finally:
        _who.reset(token)
        if request_token is not None:
            _request_id.reset(request_token)


def enter(who: Who | None) -> Token[Who | Callable[[], Who | None] | None]:
    """``acting`` for hooks that cannot wrap a block (a task's start): ``leave`` with the token."""
    return _who.set(who)


def leave(token: Token[Who | Callable[[], Who | None] | None]) -> None:
    try:
        _who.reset(token)
    except ValueError:  # entered in another context (a task run eagerly on another thread)
        _who.set(None)


def current_request_id() -> str:
    return _request_id.get()


def current_who() -> Who:
    """Who acts in this context (the system when no door said)."""
    found = _who.get()
    if callable(found):
        found = found()
    return found if found is not None else SYSTEM


def who_of(actor: Any) -> Who:
    """The actor of a row: ``actor`` when given (a signed-in user, or a ``Who``), else the context's."""
    if isinstance(actor, Who):
        return actor
    if actor is not None and getattr(actor, "is_authenticated", False):
        return who_user(actor)
    return current_who()


# --- digests -----------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_plain(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    return value


def digest(fields: Mapping[str, Any] | None) -> str | None:
    """sha256 of the canonical JSON of ``fields`` (sorted keys, no spaces); None for None. The
    caller passes the fields that matter and never a secret's value: a digest of a short
    secret could be guessed back."""
    if fields is None:
        return None
    canonical = json.dumps(_plain(fields), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def user_fields(user: Any) -> dict[str, Any]:
    """What the digests cover of a user (the Studio's users' page, the ``graphene`` command's
    first admin and ``--create-user``): never the password, not even its salted hash (a
    password change says so in its row's detail instead)."""
    return {
        "username": user.get_username(),
        "email": user.email,
        "first_name": user.first_name,
        "last_name": user.last_name,
        "is_active": user.is_active,
        "is_staff": user.is_staff,
        "is_superuser": user.is_superuser,
        "groups": sorted(user.groups.values_list("name", flat=True)) if user.pk else [],
        "user_permissions": sorted(user.user_permissions.values_list("codename", flat=True)) if user.pk else [],
    }


# --- writing -----------------------------------------------------------------------------------


@dataclass
class Change:
    """One row to write: what was done to which object, and the object's fields before and after."""

    action: str
    resource: str
    object_id: Any
    namespace: str
    object_name: str = ""
    before: Mapping[str, Any] | None = None
    after: Mapping[str, Any] | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


def _row(change: Change, who: Who, request_id: str, at: datetime) -> AuditEntry:
    return AuditEntry(
        created_at=at,
        actor_kind=who.kind,
        actor_id=who.id[:64],
        actor_name=who.name[:150],
        action=change.action,
        resource=change.resource,
        object_id=str(change.object_id)[:64],
        object_name=(change.object_name or "")[:253],
        namespace=change.namespace or EVERYWHERE,
        request_id=request_id,
        before_digest=digest(change.before),
        after_digest=digest(change.after),
        detail=_plain(dict(change.detail)),
    )


# The columns an INSERT writes (all but the id), in the model's order.
_FIELDS = [f for f in AuditEntry._meta.concrete_fields if not f.primary_key]


def _insert(rows: list[AuditEntry]) -> None:
    """One INSERT statement for ``rows``; their ids are set from it.

    Raw SQL, not the ORM: a row is written with every declaration a run makes, and the ORM's
    ``save``/``bulk_create`` of one row cost about twice the CPU of this statement (measured:
    bench/records_insert.py and docs/audit.md, Cost). The values still go through each field's
    own conversion for the database (dates, JSON)."""
    table = connection.ops.quote_name(AuditEntry._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(f.column) for f in _FIELDS)
    one = "(" + ", ".join(["%s"] * len(_FIELDS)) + ")"
    params = [f.get_db_prep_save(getattr(row, f.attname), connection) for row in rows for f in _FIELDS]
    sql = f"INSERT INTO {table} ({columns}) VALUES {', '.join([one] * len(rows))}"  # noqa: S608 - our own names
    pg = is_postgresql()
    with connection.cursor() as cursor:
        cursor.execute(sql + (" RETURNING id" if pg else ""), params)
        if pg:
            ids = [found[0] for found in cursor.fetchall()]
        else:  # SQLite numbers one statement's rows consecutively, under its write lock
            last = cursor.lastrowid
            ids = list(range(last - len(rows) + 1, last + 1))
    for row, pk in zip(rows, ids, strict=True):
        row.pk = pk


def _check_transaction() -> None:
    if not connection.in_atomic_block:
        # Outside a transaction the change could commit without its row, or the row without it.
        raise RuntimeError("audit_write needs the transaction of the change it records")


def audit_write(
    *,
    action: str,
    resource: str,
    object_id: Any,
    namespace: str,
    object_name: str = "",
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    detail: Mapping[str, Any] | None = None,
    actor: Any = None,
) -> AuditEntry:
    """Record one write, in the caller's transaction (one INSERT). ``actor``: the user who
    asked (or a ``Who``); ``None`` takes the context's actor, else the system. ``before`` and
    ``after`` are the object's fields that matter (None before a create, after a delete);
    only their digests are kept."""
    _check_transaction()
    change = Change(action, resource, object_id, namespace, object_name, before, after, detail or {})
    row = _row(change, who_of(actor), current_request_id(), timezone.now())
    _insert([row])
    return row


def audit_row(
    *,
    action: str,
    resource: str,
    object_id: Any,
    namespace: str,
    object_name: str = "",
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    detail: Mapping[str, Any] | None = None,
    actor: Any = None,
) -> AuditEntry:
    """The row ``audit_write`` would insert, unsaved, for a service that writes it within a
    statement of its own (a declaration's one INSERT ... SELECT). The same rule holds: the row
    commits or rolls back with the change, so the caller must be inside its transaction."""
    _check_transaction()
    change = Change(action, resource, object_id, namespace, object_name, before, after, detail or {})
    return _row(change, who_of(actor), current_request_id(), timezone.now())


def audit_write_many(changes: Sequence[Change], *, actor: Any = None) -> None:
    """Record several writes of one change (a batch) with one INSERT, in the caller's transaction."""
    if not changes:
        return
    _check_transaction()
    who, request_id, at = who_of(actor), current_request_id(), timezone.now()
    _insert([_row(change, who, request_id, at) for change in changes])


# --- retention ---------------------------------------------------------------------------------

PRUNE_SETTING: Final = "graphene.audit_prune"


def retention() -> timedelta:
    return timedelta(days=settings.GRAPHENE_AUDIT_RETENTION_DAYS)


def audit_prune(*, now: datetime | None = None, batch: int = 5000) -> int:
    """Delete rows older than ``GRAPHENE_AUDIT_RETENTION_DAYS``, oldest first, ``batch`` rows
    per transaction (short transactions; a long backlog goes in many). On PostgreSQL each
    transaction first says ``SET LOCAL graphene.audit_prune = 'on'``, the one permission the
    table's trigger gives for a DELETE. Returns how many rows went."""
    cutoff = (now or timezone.now()) - retention()
    total = 0
    while True:
        with transaction.atomic():
            if is_postgresql():
                with connection.cursor() as cursor:
                    cursor.execute(f"SET LOCAL {PRUNE_SETTING} = 'on'")
            ids = list(
                AuditEntry.objects.filter(created_at__lt=cutoff)
                .order_by("created_at", "id")[:batch]
                .values_list("id", flat=True)
            )
            if ids:
                AuditEntry.objects.filter(id__in=ids).delete()
        total += len(ids)
        if len(ids) < batch:
            return total
