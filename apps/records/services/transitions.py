"""What every part of the records services shares: checked phase transitions with their
events, locks (tree roots, rows, a record's operation lock), client notifications, and the
enqueueing of convergence and deletion after commit."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection, transaction
from django.db.models import Exists, Field, OuterRef
from django.utils import timezone

from apps.core import audit, domain
from apps.core.db import advisory_lock, is_postgresql, lock_key, prepared_cursor, uuid_array
from apps.core.errors import Conflict, GrapheneError
from apps.core.events import publish_many_on_commit
from apps.core.models import AuditEntry
from apps.records.choices import TRANSITIONS, EventType, Phase
from apps.records.models import Event, Record

Actor = AbstractBaseUser | AnonymousUser | None

# Phases in which a create may be running, so a delete must wait for the operation lock.
_CREATE_IN_FLIGHT = frozenset({Phase.PENDING, Phase.CREATING, Phase.UPDATING})

# Phases that convergence works on.
_CONVERGIBLE = frozenset({Phase.PENDING, Phase.CREATING, Phase.UPDATING})


class IllegalTransition(GrapheneError):
    code = "illegal_transition"


def _actor_id(actor: Actor) -> Any:
    return actor.pk if actor is not None and actor.is_authenticated else None


def _lease() -> timedelta:
    return timedelta(seconds=settings.GRAPHENE_OPERATION_LEASE_SECONDS)


def backoff_seconds(attempt: int) -> float:
    """Exponential backoff with 10 % jitter: base, 2·base, 4·base … capped."""
    base = settings.GRAPHENE_RETRY_BASE_SECONDS * (2 ** max(attempt - 1, 0))
    delay: float = min(base, settings.GRAPHENE_RETRY_MAX_SECONDS)
    return delay * random.uniform(0.9, 1.1)  # noqa: S311 - jitter, not crypto


def _event(
    record_id: Any,
    type: str,
    *,
    reason: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
    actor: Actor = None,
    at: datetime | None = None,
) -> Event:
    return Event(
        record_id=record_id,
        type=type,
        reason=reason,
        message=message,
        data=data or {},
        actor_id=_actor_id(actor),
        created_at=at or timezone.now(),
    )


def records_group(namespace: str | None = None) -> str:
    """The Channels group of record hints: every namespace's (``records``), or one's."""
    return "records" if namespace is None else f"records.{namespace}"


def _notify(records: Iterable[Record]) -> None:
    """Tell watchers (Studio, CLI) which records changed; they re-fetch over REST. Each hint goes
    to the group of all namespaces and to its namespace's, so a watcher who may read only some
    namespaces hears only of their records."""
    by_namespace: dict[str, list[str]] = {}
    for record in records:
        by_namespace.setdefault(record.namespace, []).append(str(record.pk))
    messages = []
    for namespace, id_list in by_namespace.items():
        message = {"event": "records.changed", "ids": id_list}
        messages += [(records_group(), message), (records_group(namespace), message)]
    publish_many_on_commit(messages)


def _lock_tree(tree_id: int) -> None:
    """Serialize changes to one tree's shape by locking its root row."""
    if is_postgresql():
        # Every declaration starts here: one prepared statement, no queryset to build (the
        # ``record_root`` index finds the row).
        with prepared_cursor() as cursor:
            cursor.execute(
                'SELECT "id" FROM "records_record" WHERE "tree_id" = %s AND "parent_id" IS NULL FOR NO KEY UPDATE',
                [tree_id],
            )
        return
    list(
        Record.objects.select_for_update(no_key=True)
        .filter(tree_id=tree_id, parent__isnull=True)
        .order_by()
        .values_list("pk", flat=True)
    )


def _lock_rows(ids: Iterable[Any]) -> None:
    """Lock rows in a consistent order (by primary key) so concurrent batches cannot deadlock."""
    ids = list(ids)
    if not ids:
        return
    if is_postgresql():  # every deletion batch: one prepared statement, the ids as one array
        with prepared_cursor() as cursor:
            cursor.execute(
                "SELECT id FROM records_record WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE", [uuid_array(ids)]
            )
            cursor.fetchall()
        return
    list(Record.objects.select_for_update(no_key=True).filter(pk__in=ids).order_by("pk").values_list("pk"))


def _transition(
    records: Sequence[Record],
    to: str,
    *,
    reason: str,
    message: str = "",
    data: dict[str, Any] | None = None,
    actor: Actor = None,
    fields: dict[str, Any] | None = None,
) -> None:
    """Move locked ``records`` to phase ``to``; one event each, same transaction.

    The caller holds the rows' locks inside ``transaction.atomic``.
    """
    if not records:
        return
    now = timezone.now()
    for record in records:
        if to not in TRANSITIONS[record.phase]:
            raise IllegalTransition(f"{record} cannot go from {record.phase} to {to}")
    changes = [(record.pk, record.phase) for record in records]
    if is_postgresql() and not any(hasattr(v, "resolve_expression") for v in (fields or {}).values()):
        _transition_statement(changes, to, now, reason=reason, message=message, data=data, actor=actor, fields=fields)
    else:
        Record.objects.filter(pk__in=[pk for pk, _ in changes]).update(phase=to, updated_at=now, **(fields or {}))
        Event.objects.bulk_create(
            [
                _event(
                    pk,
                    EventType.PHASE_CHANGED,
                    reason=reason,
                    message=message,
                    data={"from": phase, "to": to, **(data or {})},
                    actor=actor,
                    at=now,
                )
                for pk, phase in changes
            ]
        )
    for record in records:
        record.phase = to
        for name, value in (fields or {}).items():
            setattr(record, name, value)
    _notify(records)
    if to in _SETTLING:
        domain.emit(domain.RecordsSettled(record_ids=tuple(str(r.pk) for r in records)))


def _transition_statement(
    changes: Sequence[tuple[Any, str]],
    to: str,
    now: datetime,
    *,
    reason: str,
    message: str,
    data: dict[str, Any] | None,
    actor: Actor,
    fields: dict[str, Any] | None,
) -> None:
    """PostgreSQL: the rows' UPDATE and their events' INSERT as one statement.

    The (id, from phase) pairs travel as one JSON parameter: a deletion batch moves a hundred
    records at a time, and the ORM's UPDATE ... IN (...) plus ``bulk_create`` of the events
    sent a parameter per id and seven per event, each quoted in Python (measured with
    bench/cascade_delete.py: that quoting and the model instances cost more CPU than the
    statements themselves). Each event's ``data`` is ``{"from", "to", **data}`` as the ORM
    path writes it (``||`` lets ``data`` override, as the dict does)."""
    values = {"phase": to, "updated_at": now, **(fields or {})}
    assignments, params = [], []
    for name, value in values.items():
        field = Record._meta.get_field(name)
        assert isinstance(field, Field)  # a concrete column of the record (its callers' fields)
        assignments.append(f"{connection.ops.quote_name(field.column)} = %s")
        params.append(field.get_db_prep_save(value, connection))
    event_field = Event._meta.get_field("data")
    actor_type = Event._meta.get_field("actor").db_type(connection)
    sql = f"""
        WITH t AS (
            SELECT (e->>0)::uuid AS id, e->>1 AS from_phase, ord
            FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS x(e, ord)
        ), u AS (
            UPDATE records_record r SET {", ".join(assignments)} FROM t WHERE r.id = t.id RETURNING r.id
        )
        INSERT INTO records_event (record_id, type, reason, message, data, actor_id, created_at)
        SELECT t.id, %s::text, %s::text, %s::text,
               jsonb_build_object('from', t.from_phase, 'to', %s::text) || %s::jsonb, %s::{actor_type}, %s::timestamptz
        FROM t ORDER BY t.ord
    """  # noqa: S608 - column names from the model
    with prepared_cursor() as cursor:
        cursor.execute(
            sql,
            [
                json.dumps([[str(pk), phase] for pk, phase in changes]),
                *params,
                EventType.PHASE_CHANGED,
                reason,
                message,
                to,
                event_field.get_db_prep_save(data or {}, connection),
                _actor_id(actor),
                now,
            ],
        )


def record_transition(
    records: Sequence[Record],
    to: str,
    *,
    reason: str,
    message: str = "",
    data: dict[str, Any] | None = None,
    actor: Actor = None,
    fields: dict[str, Any] | None = None,
) -> None:
    """For other apps whose records change phase on their own events (an agent connecting):
    the same checked transition and event. Hold the rows' locks inside ``transaction.atomic``."""
    _transition(records, to, reason=reason, message=message, data=data, actor=actor, fields=fields)


def record_event_write(
    record_id: Any,
    type: str,
    *,
    reason: str,
    message: str = "",
    data: dict[str, Any] | None = None,
    actor: Actor = None,
) -> Event:
    """Append an event to a record's history (not a phase change: those go through transitions)
    and tell its watchers."""
    event = Event.objects.create(
        **_event_kwargs(record_id, type, reason=reason, message=message, data=data or {}, actor=actor)
    )
    namespace = Record.objects.filter(pk=record_id).values_list("namespace", flat=True).first()
    if namespace is not None:
        _notify([Record(pk=record_id, namespace=namespace)])
    return event


# Whatever waits on a record (a run's ``Resource.ready()``) is told when it reaches one of
# these (``RecordsSettled``); DELETED and DELETE_FAILED always follow DELETING, which told it.
_SETTLING = frozenset({Phase.READY, Phase.CREATE_FAILED, Phase.DRIFTED, Phase.DELETING})


def operation_resumed_tell(record_id: Any, *, previous: Any, worker: Any, what: str) -> None:
    """An operation whose previous holder did not finish it (a worker that died, or was lost)
    goes on here: say so in the record's history, naming both workers."""
    from apps.core import workers

    before = workers.worker_describe(previous)
    here = workers.worker_describe(worker) if worker is not None else {"worker": None}
    where = workers.worker_text(here) if worker is not None else "outside any worker"
    record_event_write(
        record_id,
        EventType.NOTE,
        reason="Resumed",
        message=f"{what} resumed on {where}; worker {workers.worker_text(before)} did not finish it",
        data={"previous": before, "worker": here},
    )


@contextmanager
def operation_lock(record_id: Any) -> Iterator[None]:
    """Hold the record's operation lock: create and delete of one record never overlap.

    PostgreSQL: a session advisory lock, released if the worker dies (its connection closes).
    SQLite (embedded, one process): a process-local lock (``apps.core.db.advisory_lock``).
    """
    with advisory_lock(lock_key(str(record_id))):
        yield


def _audited(record: Record) -> dict[str, Any]:
    """A record's fields that the audit trail's digests cover: what a user or a run decides
    (not what convergence observes: outputs, conditions, phase)."""
    return {
        "id": record.pk,
        "kind": record.kind,
        "name": record.name,
        "namespace": record.namespace,
        "owner": record.parent_id,
        "spec": record.spec,
        "labels": record.labels,
        "generation": record.generation,
        "expires_at": record.expires_at,
        "drift_policy": record.drift_policy,
        "observe_every": record.observe_every,
        "deletion_requested_at": record.deletion_requested_at,
        "protected": record.protected,
    }


def _audit(
    action: str,
    record: Record,
    *,
    actor: Actor,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    **detail: Any,
) -> None:
    """The audit row of a write to ``record``, in the caller's transaction."""
    audit.audit_write(
        action=action,
        resource="records",
        object_id=record.pk,
        object_name=f"{record.kind}/{record.name}",
        namespace=record.namespace,
        before=before,
        after=after,
        detail=detail,
        actor=actor,
    )


def _audit_row(
    action: str,
    record: Record,
    *,
    actor: Actor,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    **detail: Any,
) -> AuditEntry:
    """``_audit``'s row, unsaved, for a statement that writes it with the change."""
    return audit.audit_row(
        action=action,
        resource="records",
        object_id=record.pk,
        object_name=f"{record.kind}/{record.name}",
        namespace=record.namespace,
        before=before,
        after=after,
        detail=detail,
        actor=actor,
    )


def _event_kwargs(record_id: Any, type: str, **kwargs: Any) -> dict[str, Any]:
    event = _event(record_id, type, **kwargs)
    return {f.attname: getattr(event, f.attname) for f in Event._meta.concrete_fields if f.attname != "id"}


def _owner_check_alive(owner: Record) -> None:
    if owner.phase == Phase.DELETED or owner.deletion_requested_at is not None:
        raise Conflict(f"owner {owner} ({owner.pk}) is being deleted; it cannot own new records")


def _enqueue_converge_on_commit(record_id: Any, countdown: float = 0) -> None:
    from apps.records.tasks import record_converge_task

    transaction.on_commit(lambda: record_converge_task.apply_async((str(record_id),), countdown=countdown))


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _live_children() -> Exists:
    return Exists(Record.objects.filter(parent=OuterRef("pk")).exclude(phase=Phase.DELETED))


def _held() -> Exists:
    """Whether a protected record holds the row back from deletion: a protected record at or
    above it in its tree whose deletion was requested no later than the row's (the row's own
    deletion came through it). A deletion requested of the row earlier, on its own, goes on:
    protecting an owner does not stop what was already being deleted below it."""
    return Exists(
        Record.objects.filter(
            protected=True,
            tree_id=OuterRef("tree_id"),
            lft__lte=OuterRef("lft"),
            rght__gte=OuterRef("rght"),
            deletion_requested_at__isnull=False,
            deletion_requested_at__lte=OuterRef("deletion_requested_at"),
        )
    )


# ``_held()`` in SQL, for the raw statements of a deletion batch (delete.py): a protected
# record at or above the row ``{row}`` whose deletion was requested no later than the row's.
# The two must say the same (tests/records/test_protect.py holds both to it).
HELD_SQL = """EXISTS (
    SELECT 1 FROM records_record h
    WHERE h.protected AND h.tree_id = {row}.tree_id AND h.lft <= {row}.lft AND h.rght >= {row}.rght
      AND h.deletion_requested_at IS NOT NULL AND h.deletion_requested_at <= {row}.deletion_requested_at
)"""


def _blocked() -> Exists:
    """Whether the row owns (directly or below) a protected record whose deletion was requested:
    children go first, so the row's own deletion waits until that one is unprotected."""
    return Exists(
        Record.objects.filter(
            protected=True,
            tree_id=OuterRef("tree_id"),
            lft__gt=OuterRef("lft"),
            rght__lt=OuterRef("rght"),
            deletion_requested_at__isnull=False,
        )
    )


def _enqueue_deletions_on_commit(rows: Iterable[tuple[Any, Any]]) -> None:
    """Enqueue deletion of (id, parent_id) rows in batches; siblings stay together so the
    task that deletes the last of them can go on with their parent."""
    from apps.records.tasks import records_delete_task

    ids = [str(pk) for pk, _parent in sorted(rows, key=lambda row: str(row[1]))]
    batches = deletion_batches(ids)
    if batches:
        transaction.on_commit(lambda: [records_delete_task.delay(batch) for batch in batches])


def deletion_batches(ids: list[str]) -> list[list[str]]:
    """``ids`` in consecutive batches of at most ``GRAPHENE_DELETE_BATCH``, as even as they
    come, and at least two once there are more than half a batch: every batch costs its task
    a claim, a finish and two commits whatever its size (bench/cascade_delete.py: 200 a batch
    deleted about a sixth faster than 100), while a few hundred slow deletes (containers) still
    go to two tasks, which two worker processes take, rather than wait on one batch's threads."""
    if not ids:
        return []
    size = max(1, settings.GRAPHENE_DELETE_BATCH)
    count = -(-len(ids) // size)
    if count == 1 and len(ids) > size // 2:
        count = 2
    cut = -(-len(ids) // count)
    return [ids[i : i + cut] for i in range(0, len(ids), cut)]


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
