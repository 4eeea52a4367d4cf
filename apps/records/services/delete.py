"""Cascade deletion, children first (I3): the deletable frontier in batches of siblings,
branches in parallel; a failed delete retried with backoff forever and kept visible (I6)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from apps.core import access, domain, workers
from apps.core.db import (
    JsonRows,
    closes_connections,
    is_postgresql,
    json_rows,
    models_from_row,
    prepared_cursor,
    select_columns,
    uuid_array,
)
from apps.core.models import AuditEntry
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from apps.records.services.placement import _left_behind
from apps.records.services.protect import deletion_blocked_tell, deletion_hold
from apps.records.services.transitions import (
    _CREATE_IN_FLIGHT,
    HELD_SQL,
    Actor,
    _audit,
    _audit_row,
    _audited,
    _enqueue_deletions_on_commit,
    _error_text,
    _event,
    _event_kwargs,
    _held,
    _lease,
    _live_children,
    _lock_rows,
    _lock_tree,
    _notify,
    _transition,
    backoff_seconds,
    operation_lock,
    operation_resumed_tell,
)
from kinds import NotYet, get_kind


def record_delete_request(
    *, record: Record, actor: Actor = None, reason: str = "DeleteRequested", message: str = ""
) -> Record:
    """Request deletion of ``record`` and its whole subtree, children first (I3).

    A protected record in the subtree (or ``record`` itself) stops the deletion there: it and
    what it owns stay, its owners up to ``record`` wait (``services.protect``); the rest goes.
    """
    access.require_actor(actor, "delete", "records", record.namespace)
    with transaction.atomic():
        if record.parent_id is None:
            fresh = _lock_root(record.pk)
            if fresh is None:
                return record
            record = fresh
        else:
            _lock_tree(record.tree_id)
            record = Record.objects.get(pk=record.pk)
        if record.phase == Phase.DELETED:
            return record
        _delete_request_locked(record, actor=actor, reason=reason, message=message)
    return record


def root_delete_request(*, root_id: Any, reason: str, locked: Record | None = None) -> Record | None:
    """``record_delete_request`` of the tree root ``root_id`` by the system (a run that ended):
    None when it is gone already. ``locked``: the root as the caller's transaction read and
    locked it already (``run_lock(with_root=True)``). No savepoint of its own inside the
    caller's transaction: an error here ends the run's end as a whole."""
    with transaction.atomic(savepoint=False):
        root = locked if locked is not None and locked.pk == root_id else _lock_root(root_id)
        if root is None or root.phase == Phase.DELETED:
            return root
        _delete_request_locked(root, actor=None, reason=reason, message="")
    return root


def _lock_root(root_id: Any) -> Record | None:
    """The root ``root_id`` read fresh and locked: a root's row is its tree's lock
    (``_lock_tree``), so one statement takes the lock and reads it. None if there is no such root."""
    if not is_postgresql():
        return Record.objects.filter(pk=root_id, parent__isnull=True).first()
    # Raw: a run's end waits for this statement; its queryset compiled slower than it ran.
    return next(iter(Record.objects.raw(_ROOT_FOR_UPDATE, [root_id])), None)


_ROOT_FOR_UPDATE = "SELECT * FROM records_record WHERE id = %s AND parent_id IS NULL FOR NO KEY UPDATE"


def _delete_request_locked(record: Record, *, actor: Actor, reason: str, message: str) -> None:
    """Mark the live subtree of ``record`` (its tree locked, read under the lock), write the
    event and audit row, and send the deletable frontier once the transaction commits."""
    now = timezone.now()
    before = _audited(record)
    event = _event(
        record.pk,
        EventType.DELETION_REQUESTED,
        reason=reason,
        message=message or f"deleting {record} and its subtree",
        actor=actor,
        at=now,
    )
    if is_postgresql():
        row = _audit_row("record.delete_request", record, actor=actor, before=before, after=None, reason=reason)
        frontier, protected = _mark_subtree(record, now=now, event=event, audit_row=row)
    else:
        marked = (
            _subtree(record)
            .filter(deletion_requested_at__isnull=True)
            .update(deletion_requested_at=now, next_attempt_at=now + _lease(), updated_at=now)
        )
        _audit("record.delete_request", record, actor=actor, before=before, after=None, reason=reason, subtree=marked)
        event.data = {"subtree_records": marked}
        event.save(force_insert=True)
        frontier, protected = None, True  # the frontier from the ORM, below
    if protected and deletion_hold(_subtree(record)):
        frontier = list(_deletable(record).filter(~_held()).values_list("pk", "parent_id"))
        deletion_blocked_tell(tree_id=record.tree_id, lft=record.lft, rght=record.rght)
    elif frontier is None:
        frontier = list(_deletable(record).values_list("pk", "parent_id"))
    _enqueue_deletions_on_commit(frontier)
    _notify([record])
    record.deletion_requested_at = record.deletion_requested_at or now


# Records whose own delete is under way: they are not sent again.
_OWN_DELETE = (Phase.DELETING, Phase.DELETE_FAILED)


def _subtree(record: Record) -> QuerySet[Record]:
    """``record`` and what it owns, deleted rows left out."""
    return Record.objects.filter(tree_id=record.tree_id, lft__gte=record.lft, rght__lte=record.rght).exclude(
        phase=Phase.DELETED
    )


def _deletable(record: Record) -> QuerySet[Record]:
    """The subtree's frontier: rows without live children whose own delete is not under way."""
    return _subtree(record).exclude(phase__in=_OWN_DELETE).filter(~_live_children())


# A deletion request in one statement (PostgreSQL, the tree locked): the subtree's live rows
# marked, the request's event and audit row written with the number marked, and the frontier
# (live rows without live children, whose own delete is not under way) returned, with whether
# a protected record is in the subtree (then the caller holds what it holds back).
_MARK_SUBTREE = """
WITH sub AS (
    SELECT id, parent_id, phase, deletion_requested_at, protected FROM records_record
    WHERE tree_id = %(tree)s AND lft >= %(lft)s AND rght <= %(rght)s AND phase <> 'deleted'
), marked AS (
    UPDATE records_record r SET deletion_requested_at = %(now)s, next_attempt_at = %(next)s, updated_at = %(now)s
    FROM sub WHERE r.id = sub.id AND sub.deletion_requested_at IS NULL
    RETURNING r.id
), n AS (
    SELECT count(*) AS marked FROM marked
), ev AS (
    INSERT INTO records_event ({event_columns})
    SELECT {event_select} FROM n, jsonb_to_recordset(%(events)s::jsonb) AS x({event_recordset})
), au AS (
    INSERT INTO core_auditentry ({audit_columns})
    SELECT {audit_select} FROM n, jsonb_to_recordset(%(audit)s::jsonb) AS x({audit_recordset})
)
SELECT
    (SELECT marked FROM n),
    EXISTS (SELECT 1 FROM sub WHERE protected),
    ARRAY(
        SELECT ARRAY[s.id::text, s.parent_id::text] FROM sub s
        WHERE s.phase NOT IN ('deleting', 'delete_failed') AND NOT EXISTS (SELECT 1 FROM sub c WHERE c.parent_id = s.id)
    )
"""


def _mark_subtree(
    record: Record, *, now: datetime, event: Event, audit_row: AuditEntry
) -> tuple[list[tuple[Any, Any]], bool]:
    """Run ``_MARK_SUBTREE`` for ``record``: the frontier's (id, parent id) rows and whether the
    subtree holds a protected record."""
    events, audit_rows = json_rows(Event, [event]), json_rows(AuditEntry, [audit_row])

    def select(rows: JsonRows, merged: str, key: str) -> str:
        return ", ".join(
            f"x.{column} || jsonb_build_object('{key}', n.marked)" if column == merged else f"x.{column}"
            for column in rows.columns
        )

    sql = _MARK_SUBTREE.format(
        event_columns=", ".join(events.columns),
        event_recordset=events.recordset,
        event_select=select(events, '"data"', "subtree_records"),
        audit_columns=", ".join(audit_rows.columns),
        audit_recordset=audit_rows.recordset,
        audit_select=select(audit_rows, '"detail"', "subtree"),
    )
    params = {
        "tree": record.tree_id,
        "lft": record.lft,
        "rght": record.rght,
        "now": now,
        "next": now + _lease(),
        "events": events.param,
        "audit": audit_rows.param,
    }
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        _marked, protected, frontier = cursor.fetchone()
    return [(pk, parent) for pk, parent in frontier], protected


def _run_deletes(records: Sequence[Record], wait_for_create: set[Any]) -> dict[Any, BaseException | None]:
    """Call each kind's delete; independent objects are deleted concurrently."""

    def one(record: Record) -> BaseException | None:
        try:
            kind = get_kind(record.kind)
            left_behind = _left_behind(record)  # a move not finished: the old place first
            if record.pk in wait_for_create:
                with operation_lock(record.pk):
                    if left_behind is not None:
                        kind.delete(left_behind)
                    kind.delete(record)
            else:
                if left_behind is not None:
                    kind.delete(left_behind)
                kind.delete(record)
        except Exception as exc:
            return exc
        return None

    if len(records) == 1:
        return {records[0].pk: one(records[0])}
    if any(r.pk in wait_for_create for r in records):
        # The operation lock uses this thread's database connection: stay on this thread.
        return {r.pk: one(r) for r in records}
    # Each thread takes the next record until none is left: a slow delete holds up no other,
    # as with a task per record, without a future and a hand-over per record. This thread
    # starts alone; pool threads join once one of its deletes has run ``SPREAD_AFTER``.
    # Deletes that take microseconds (a file) are then all done by one thread, however many:
    # sixteen threads taking turns at the interpreter's lock cost a worker more CPU than the
    # deletes did (bench/cascade_delete.py); deletes that wait on a remote API are spread over
    # the pool after a delay that is small beside one of them. A kind's delete may use the
    # database (logs, lookups): on a pool thread that opens the thread's own connection,
    # which nothing else would ever close.
    pending = iter(records)
    take = threading.Lock()
    results: dict[Any, BaseException | None] = {}
    finished = threading.Event()
    # When this thread's delete under way began (None between deletes), for ``spread``.
    began: list[float | None] = [None]

    def drain(*, timed: bool = False) -> None:
        while True:
            with take:
                record = next(pending, None)
            if record is None:
                return
            if timed:
                began[0] = time.monotonic()
            results[record.pk] = one(record)
            if timed:
                began[0] = None

    helpers: list[Future[None]] = []

    def spread() -> None:
        while not finished.wait(SPREAD_AFTER):
            started = began[0]
            if started is None or time.monotonic() - started < SPREAD_AFTER:
                continue
            # Never waits on the threads it adds (the calling thread does): a pool thread
            # waiting on other pool threads could wait for ever behind other batches' work.
            helpers.extend(_executor().submit(closes_connections(drain)) for _ in range(width - 2))
            drain()
            return

    width = min(DELETE_THREADS, len(records))
    spreader = _executor().submit(closes_connections(spread))
    try:
        drain(timed=True)
    finally:
        finished.set()
        spreader.result()  # after it, ``helpers`` holds every thread it added
        for helper in helpers:
            helper.result()
    return {r.pk: results[r.pk] for r in records}


_pool: ThreadPoolExecutor | None = None

# Deletes of one batch at once, per process (the calling thread and pool threads); at most as
# many database sessions, each closed when its delete ends.
DELETE_THREADS = 16

# Seconds one delete runs on a batch's calling thread before pool threads join it.
SPREAD_AFTER = 0.01


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=DELETE_THREADS - 1, thread_name_prefix="graphene-delete")
    return _pool


def record_delete_batch(*, record_ids: Sequence[Any]) -> None:
    """Delete a batch of records whose children are all gone, then go on up the tree.

    Parents left without live children are deleted by the same task (the next batch), so a
    branch is walked to its top without a round trip through the broker per level; more
    parents than one batch holds are handed to new tasks. The transaction that marks a batch
    deleted also claims the parents it leaves ready (one commit per level, not two). If this
    task dies on the way, its redelivery finds the parents again from the ids it was given
    (see ``_claim``), and the reconciler (the claimed records' leases) is the net below that.
    """
    with transaction.atomic():
        batch = _claim(list(record_ids))
    while batch is not None:
        started_at = timezone.now()
        results = _run_deletes(batch.records, batch.wait_for_create)
        with transaction.atomic():
            parents = _finish(batch.records, results, started_at)
            batch = _claim(parents) if parents else None


@dataclass
class _Batch:
    """Records claimed for deletion (now ``deleting``, with a lease) and those of them whose
    delete must take the operation lock first."""

    records: list[Record]
    wait_for_create: set[Any]


def _claim(record_ids: list[Any]) -> _Batch | None:
    """Lock the given records, move those without live children to ``deleting``; None when
    none is left to delete here. Runs in the caller's transaction."""
    while record_ids:
        rows = _claimable(record_ids)
        busy = _with_live_children([r.pk for r in rows])
        # A protected record holds these (a message sent before it was held, a reconciler's
        # look): they wait, without a lease, until it is unprotected.
        held = [r.pk for r in rows if r.is_held and r.phase not in (Phase.DELETING, Phase.DELETE_FAILED)]
        if held:
            Record.objects.filter(pk__in=held).update(next_attempt_at=None)
        claim = [r for r in rows if r.pk not in busy and r.pk not in held]
        if not claim:
            if rows:
                return None  # children still live: the task deleting the last of them goes on
            # Everything given is deleted already: a redelivery after this task died further up,
            # perhaps with the parents claimed (``deleting``) and their deletes not done; they are
            # resumed under the operation lock as any ``deleting`` record is.
            parent_ids = set(
                Record.objects.filter(pk__in=record_ids, parent_id__isnull=False).values_list("parent_id", flat=True)
            )
            record_ids = _ready_parents(parent_ids, resume=True)
            continue
        # A record already ``deleting`` was claimed by a batch that died (perhaps while waiting
        # for an in-flight create): take the operation lock again rather than race that create.
        resumed = [r.pk for r in claim if r.phase == Phase.DELETING]
        wait_for_create = {r.pk for r in claim if r.phase in _CREATE_IN_FLIGHT} | set(resumed)
        worker = workers.current_worker_id()
        lease = {"next_attempt_at": timezone.now() + _lease(), "held_by": worker}
        _transition([r for r in claim if r.phase != Phase.DELETING], Phase.DELETING, reason="Deleting", fields=lease)
        if resumed:
            Record.objects.filter(pk__in=resumed).update(**lease)
        for record in claim:
            if record.held_by is not None and record.held_by != worker:
                operation_resumed_tell(record.pk, previous=record.held_by, worker=worker, what="deletion")
        return _Batch(claim, wait_for_create)
    return None


def _claimable(record_ids: list[Any]) -> list[Record]:
    """The given records whose deletion was requested and that are not deleted, locked (by
    primary key), each with ``is_held`` (``_held``). On PostgreSQL one prepared statement, the
    ids as one array: a batch's querysets cost its worker more CPU, in compiling them and
    quoting a parameter per id, than the database spent on them (bench/cascade_delete.py)."""
    if not is_postgresql():
        return list(
            Record.objects.select_for_update(no_key=True)
            .filter(pk__in=record_ids, deletion_requested_at__isnull=False)
            .exclude(phase=Phase.DELETED)
            .annotate(is_held=_held())
            .order_by("pk")
        )
    with prepared_cursor() as cursor:
        cursor.execute(_claimable_sql(), [uuid_array(record_ids)])
        found = cursor.fetchall()
    rows = []
    for values in found:
        (record,) = models_from_row((Record,), values[:-1])
        if record.deletion_requested_at is None:  # see _claimable_sql
            continue
        record.is_held = values[-1]
        rows.append(record)
    return rows


# Statements that look records up by id say ``phase <> 'deleted'`` in WHERE but check
# ``deletion_requested_at`` on the rows found: the two together are record_child_deleting's
# predicate, and the planner then scanned that whole index instead of the primary key. Its
# statistics predate the last big deletion request (the index was empty at the last ANALYZE;
# a request puts a whole subtree in it), so it took the index for empty: the claim of a
# hundred records read eleven thousand index entries (bench/cascade_delete.py).


@functools.cache
def _claimable_sql() -> str:
    return (
        f"SELECT {select_columns(Record, 'r')}, {HELD_SQL.format(row='r')} AS is_held FROM records_record r "  # noqa: S608 - names from the model
        "WHERE r.id = ANY(%s) AND r.phase <> 'deleted' ORDER BY r.id FOR NO KEY UPDATE OF r"
    )


def _with_live_children(ids: list[Any]) -> set[Any]:
    """Which of the records ``ids`` have a child that is not deleted (read after their locks)."""
    if not ids:
        return set()
    if not is_postgresql():
        return set(
            Record.objects.filter(parent_id__in=ids).exclude(phase=Phase.DELETED).values_list("parent_id", flat=True)
        )
    with prepared_cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT parent_id FROM records_record WHERE parent_id = ANY(%s) AND phase <> 'deleted'",
            [uuid_array(ids)],
        )
        return {pk for (pk,) in cursor.fetchall()}


def _finish(claim: list[Record], results: Mapping[Any, BaseException | None], started_at: datetime) -> list[Any]:
    """Mark the batch's deleted records ``deleted`` and its failed ones ``delete_failed``, in the
    caller's transaction. Returns the parents to go on with."""
    parent_ids = {r.parent_id for r in claim if r.parent_id is not None}
    _lock_rows(parent_ids)  # siblings finishing concurrently serialize here: one sees all gone
    # A duplicate message (a redelivery after a worker died, the reconciler) may have run the
    # same deletes meanwhile: re-read our rows under their locks and finish only those still
    # deleting, so each record is marked deleted exactly once. Only what can have changed
    # meanwhile is read again (the phase, the attempts): the rest of each row is what the
    # claim read, and loading whole rows again cost a model instance and the JSON columns per
    # record.
    fresh = _phases_locked([r.pk for r in claim])
    claim = [r for r in claim if fresh.get(r.pk, ("",))[0] == Phase.DELETING]
    for r in claim:
        r.phase, r.attempts = fresh[r.pk]
    now = timezone.now()
    done = [r for r in claim if results[r.pk] is None]
    waiting = [r for r in claim if isinstance(results[r.pk], NotYet)]
    claim = [r for r in claim if not isinstance(results[r.pk], NotYet)]
    if waiting:
        _delete_later(waiting, results, now)
    if claim:
        domain.emit(
            domain.RecordsDeleted(
                records=tuple(r.ref() for r in claim),  # as they were before the phases change
                errors={str(r.pk): _error_or_none(results[r.pk]) for r in claim},
                started_at=started_at,
                ended_at=now,
            )
        )
    _transition(
        done,
        Phase.DELETED,
        reason="Deleted",
        fields={
            "deleted_at": now,
            "next_attempt_at": None,
            "held_by": None,
            "attempts": 0,
            "last_error": "",
            "next_observe_at": None,
        },
    )
    for record in claim:
        error = results[record.pk]
        if error is not None:
            _delete_failed(record, error)
    return _ready_parents(parent_ids)


def _phases_locked(ids: list[Any]) -> dict[Any, tuple[str, int]]:
    """The records ``ids``, locked (by primary key): their phase and attempts."""
    if not is_postgresql():
        return {
            pk: (phase, attempts)
            for pk, phase, attempts in Record.objects.select_for_update(no_key=True)
            .filter(pk__in=ids)
            .order_by("pk")
            .values_list("pk", "phase", "attempts")
        }
    with prepared_cursor() as cursor:
        cursor.execute(
            "SELECT id, phase, attempts FROM records_record WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE",
            [uuid_array(ids)],
        )
        return {pk: (phase, attempts) for pk, phase, attempts in cursor.fetchall()}


def _error_or_none(error: BaseException | None) -> str | None:
    return None if error is None else _error_text(error)


def _ready_parents(parent_ids: Iterable[Any], *, resume: bool = False) -> list[Any]:
    """Parents being deleted whose children are all gone, and that no protected record holds:
    one batch to go on with; any more are enqueued (on commit) for other workers. ``resume``:
    also those claimed already (``deleting``) by a task that died."""
    skip = [Phase.DELETED, Phase.DELETE_FAILED] if resume else [Phase.DELETED, Phase.DELETING, Phase.DELETE_FAILED]
    parent_ids = list(parent_ids)
    if not parent_ids:
        ready: list[tuple[Any, Any]] = []
    elif is_postgresql():  # one prepared statement (as ``_claimable``)
        with prepared_cursor() as cursor:
            cursor.execute(_READY_PARENTS, [uuid_array(parent_ids), skip])
            ready = [(pk, parent) for pk, parent, requested in cursor.fetchall() if requested]
    else:
        ready = list(
            Record.objects.filter(pk__in=parent_ids, deletion_requested_at__isnull=False)
            .exclude(phase__in=skip)
            .filter(~_live_children())
            .filter(~_held())
            .order_by("parent_id", "pk")
            .values_list("pk", "parent_id")
        )
    size = max(1, settings.GRAPHENE_DELETE_BATCH)
    _enqueue_deletions_on_commit(ready[size:])
    # This task goes on with them: ``_claim``, in the same transaction, makes them held by its
    # worker (taken over should that worker be lost).
    return [pk for pk, _parent in ready[:size]]


_READY_PARENTS = f"""
SELECT r.id, r.parent_id, r.deletion_requested_at IS NOT NULL FROM records_record r
WHERE r.id = ANY(%s) AND r.phase <> ALL(%s)
  AND NOT EXISTS (SELECT 1 FROM records_record c WHERE c.parent_id = r.id AND c.phase <> 'deleted')
  AND NOT {HELD_SQL.format(row="r")}
ORDER BY r.parent_id, r.id"""  # noqa: S608 - no input in the text


def _delete_later(records: Sequence[Record], results: Mapping[Any, BaseException | None], now: datetime) -> None:
    """Deletions under way elsewhere: they stay ``deleting``; look again later (or when woken)."""
    from apps.records.tasks import records_delete_task

    for record in records:
        wait = results[record.pk]
        retry_in = max(0.0, wait.retry_in if isinstance(wait, NotYet) else 5.0)
        Record.objects.filter(pk=record.pk).update(
            next_attempt_at=now + timedelta(seconds=retry_in) + _lease(), held_by=None, updated_at=now
        )
        transaction.on_commit(partial(records_delete_task.apply_async, ([str(record.pk)],), countdown=retry_in))


def _delete_failed(record: Record, error: BaseException) -> None:
    from apps.records.tasks import records_delete_task

    attempts = record.attempts + 1
    delay = backoff_seconds(attempts)
    message = _error_text(error)
    now = timezone.now()
    Event.objects.create(
        **_event_kwargs(
            record.pk,
            EventType.ERROR,
            reason="DeleteFailed",
            message=message,
            data={"attempt": attempts, "retry_in_s": round(delay, 3)},
            at=now,
        )
    )
    _transition(
        [record],
        Phase.DELETE_FAILED,
        reason="DeleteFailed",
        message=message,
        fields={
            "attempts": attempts,
            "last_error": message,
            "next_attempt_at": now + timedelta(seconds=delay) + _lease(),
            "held_by": None,
        },
    )
    record_id = str(record.pk)
    transaction.on_commit(lambda: records_delete_task.apply_async(([record_id],), countdown=delay))
