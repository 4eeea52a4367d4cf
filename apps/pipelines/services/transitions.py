"""A run's status moves only here: checked against ``RUN_TRANSITIONS``, written with a
``RunEvent`` in the same transaction, told to watchers after commit.

The caller locks the run's row first (``run_lock``) and decides under that lock; the
transition then writes the move it decided (a queued run's lease is the exception: one
statement decides and writes it, ``run_take_queued``). Celery carries run ids;
``run_enqueue_on_commit`` sends one once the transaction that queued the run commits, and
``run_enqueue_before_commit`` from inside a start's transaction, under the run's start lock.
"""

from __future__ import annotations

import functools
import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection, transaction
from django.db.models import Field, Model
from django.utils import timezone

from apps.core import audit
from apps.core.db import (
    insert_select,
    is_postgresql,
    json_rows,
    lock_key,
    models_from_row,
    prepared_cursor,
    select_columns,
)
from apps.core.errors import GrapheneError
from apps.core.events import publish_many_on_commit
from apps.core.models import AuditEntry
from apps.pipelines.choices import RUN_TRANSITIONS
from apps.pipelines.models import Pipeline, Revision, Run, RunEvent
from apps.records.models import Record

Actor = AbstractBaseUser | AnonymousUser | None

logger = logging.getLogger(__name__)

# What a worker's ``HeldLease`` row says it holds for a run's lease: this, then the run's id
# (``workers.lease_hold`` on the locked path, ``run_take_queued``'s statement on the other).
RUN_LEASE_SUBJECT = "run "


class IllegalRunTransition(GrapheneError):
    code = "illegal_transition"


def _actor_id(actor: Actor) -> Any:
    return actor.pk if actor is not None and actor.is_authenticated else None


def run_lock(run_id: Any, *, with_root: bool = False) -> Run:
    """The run's row, locked (no key update) until the transaction ends, with its pipeline's
    (read, not locked: almost every caller names the pipeline, in events, metrics, turns) and
    its revision's (what it executes). ``Run.DoesNotExist`` if there is none.

    ``with_root``: its tree's root record too (``run.record``), read and locked (no key update)
    in the same statement, after the run's row as every run's end takes them; a run without a
    root comes without one."""
    run = run_lock_or_none(run_id, with_root=with_root)
    if run is None:
        raise Run.DoesNotExist(f"no run {run_id}")
    return run


def run_lock_or_none(run_id: Any, *, with_root: bool = False) -> Run | None:
    """``run_lock``, or None when there is no such run."""
    if not is_postgresql():
        query = Run.objects.select_related("pipeline", "revision").select_for_update(no_key=True, of=("self",))
        return query.filter(pk=run_id).first()
    # Raw and prepared: every lease taken and every run's end waits for it (the queryset
    # compiled slower than it ran).
    pk = Run._meta.pk.get_db_prep_value(run_id, connection)
    with prepared_cursor() as cursor:
        if with_root:
            cursor.execute(_run_lock_sql(with_root=True), [pk])
            row = cursor.fetchone()
            if row is not None:
                run, pipeline, revision, root = models_from_row((Run, Pipeline, Revision, Record), row)
                run.pipeline, run.revision, run.record = pipeline, revision, root
                return run
        cursor.execute(_run_lock_sql(with_root=False), [pk])
        row = cursor.fetchone()
    if row is None:
        return None
    run, pipeline, revision = models_from_row((Run, Pipeline, Revision), row)
    run.pipeline, run.revision = pipeline, revision
    return run


@functools.cache
def _run_lock_sql(*, with_root: bool) -> str:
    columns = [select_columns(Run, "r"), select_columns(Pipeline, "p"), select_columns(Revision, "v")]
    joins = [
        "JOIN pipelines_pipeline p ON p.id = r.pipeline_id",
        "LEFT JOIN pipelines_revision v ON v.id = r.revision_id",
    ]
    locked = "r"
    if with_root:
        columns.append(select_columns(Record, "rec"))
        joins.append("JOIN records_record rec ON rec.id = r.record_id AND rec.parent_id IS NULL")
        locked = "r, rec"
    return (
        f"SELECT {', '.join(columns)} FROM pipelines_run r {' '.join(joins)} "  # noqa: S608 - names from the models
        f"WHERE r.id = %s FOR NO KEY UPDATE OF {locked}"
    )


def run_take_queued(*, run_id: Any, token: uuid.UUID, lease: timedelta, worker_id: uuid.UUID | None) -> Run | bool:
    """PostgreSQL: a queued run moves to ``running`` under lease ``token`` in one statement
    (no row lock taken first, no transaction block around it): the status, the attempt, its
    ``RunEvent`` (``Started`` the first time, else ``Continued``) and the ``HeldLease`` row of
    ``worker_id`` (when given). Every run's start waits for it; the lock, the move, the event,
    the lease row and the commit were a round trip each.

    The run may have been sent before its start committed (``run_enqueue_before_commit``):
    a statement before the move waits for the start's lock (free at once when that start has
    ended), sent with it in one round trip, so that the move follows the commit without a word
    from this process in between, and reads the run as it is then.

    Outside a caller's transaction (a worker's case), the move commits without waiting for the
    WAL to reach the disk (``synchronous_commit`` off, for that commit alone): a lease is
    fenced, not kept. Were the server to crash before that write reached the disk (a fraction
    of a second; any later commit flushes it, the step's first journal write among them), the
    run would be back to queued as it was before, with nothing of it journaled, and this
    worker's writes, fenced by ``token``, refused. Inside a caller's transaction, whose other
    writes may need to last, its commit is left as it is.

    Changing nothing, whether the run is there (``True``: it is not queued, or its last event
    says its worker was lost, ``WorkerLost``, and the move must say where it resumes:
    ``run_lease_acquire`` decides it) or not (``False``: its start rolled back, or it was
    deleted). The move, its event and the lease row are stamped when the move begins (the
    database's clock, after the wait: never before the start committed), and the lease ends
    ``lease`` after that."""
    params = {
        "id": run_id,
        "token": token,
        "lease": lease,
        "worker": worker_id,
        "subject": RUN_LEASE_SUBJECT,
    }
    # In psycopg's pipeline mode errors surface when it syncs, past the cursor's own wrapper.
    alone = not connection.in_atomic_block
    with prepared_cursor() as cursor, connection.wrap_database_errors, connection.connection.pipeline():
        cursor.execute(_START_WAIT_ALONE if alone else _START_WAIT, [run_start_lock_key(run_id)])
        cursor.execute(_take_queued_sql(held=worker_id is not None), params)
        *row, there = cursor.fetchone()
    run, pipeline, revision = models_from_row((Run, Pipeline, Revision), row)
    if run is None:
        return bool(there)
    run.pipeline, run.revision = pipeline, revision
    _publish(run)
    return run


_START_WAIT = "SELECT pg_advisory_xact_lock(%s::bigint)"
_START_WAIT_ALONE = f"{_START_WAIT}, set_config('synchronous_commit', 'off', true)"


@functools.cache
def _take_queued_sql(*, held: bool) -> str:
    # ``attempt`` goes up by one at each lease and only then, and ``started_at`` is set at the
    # first: the first lease is the one that makes it 1.
    held_lease = (
        ", h AS (INSERT INTO core_heldlease (token, worker_id, subject, taken_at) "
        "SELECT %(token)s, %(worker)s, %(subject)s || u.id, u.updated_at FROM u)"
        if held
        else ""
    )
    return f"""
    WITH u AS (
        UPDATE pipelines_run r SET status = 'running', updated_at = statement_timestamp(), lease_token = %(token)s,
            lease_expires_at = statement_timestamp() + %(lease)s, attempt = r.attempt + 1,
            started_at = COALESCE(r.started_at, statement_timestamp()),
            waiting_on = '[]'::jsonb, wake_at = NULL
        WHERE r.id = %(id)s AND r.status = 'queued' AND (
            r.started_at IS NULL
            OR (SELECT e.reason FROM pipelines_runevent e WHERE e.run_id = r.id ORDER BY e.id DESC LIMIT 1)
               IS DISTINCT FROM 'WorkerLost'
        )
        RETURNING r.*
    ), e AS (
        INSERT INTO pipelines_runevent (run_id, from_status, to_status, reason, message, data, actor_id, created_at)
        SELECT u.id, 'queued', 'running', CASE WHEN u.attempt = 1 THEN 'Started' ELSE 'Continued' END, '',
            jsonb_build_object('attempt', u.attempt), NULL, u.updated_at
        FROM u
    ){held_lease}
    SELECT {select_columns(Run, "u")}, {select_columns(Pipeline, "p")}, {select_columns(Revision, "v")},
        EXISTS (SELECT 1 FROM pipelines_run r WHERE r.id = %(id)s)
    FROM (VALUES (1)) AS one LEFT JOIN (
        u JOIN pipelines_pipeline p ON p.id = u.pipeline_id LEFT JOIN pipelines_revision v ON v.id = u.revision_id
    ) ON true
    """  # noqa: S608 - names from the models


def _publish(run: Run) -> None:
    payload = {"event": "run.changed", "id": str(run.pk), "status": run.status}
    # For people watching: lazy, so that a worker taking a run sends nothing before its first step.
    publish_many_on_commit(
        [(f"run.{run.pk}", payload), ("runs", payload), (f"runs.{run.namespace}", payload)], lazy=True
    )


def run_enqueue_on_commit(run_id: Any, countdown: float = 0) -> None:
    """Have a worker execute the run once this transaction commits (its row says what to do)."""
    from apps.pipelines.tasks import run_execute_task

    # Robust: the run is committed, and a broker that cannot take the message now must not turn
    # that into an error (an HTTP 500 for a start that happened); the reconciler enqueues a
    # queued run that no worker took.
    transaction.on_commit(lambda: run_execute_task.apply_async((str(run_id),), countdown=countdown), robust=True)


def run_start_lock_key(run_id: Any) -> int:
    """The advisory lock that the transaction creating a run holds when it sends the run to a
    worker before committing (``run_enqueue_before_commit``); a worker's take of a queued run
    waits for it (``run_take_queued``)."""
    return lock_key(f"run-start:{uuid.UUID(str(run_id))}")


def run_enqueue_before_commit(run_id: Any) -> None:
    """Send the run to a worker now, from the transaction creating it, which holds
    ``run_start_lock_key(run_id)`` already and whose end is its commit: the message's way to a
    worker overlaps the rest of the transaction (the run's rows, their writing, the commit). The
    worker's take waits for that lock and then reads the run (``run_take_queued``), so it
    executes the run once committed and drops the message if the transaction rolled back. A
    task that would run eagerly, here and now (tests), is sent on commit as ever."""
    from apps.pipelines.tasks import run_execute_task

    if run_execute_task.app.conf.task_always_eager:
        run_enqueue_on_commit(run_id)
        return
    try:
        run_execute_task.apply_async((str(run_id),))
    except Exception:  # as on commit: the reconciler enqueues a queued run that no worker took
        logger.warning("run %s: could not send it to a worker; the reconciler will", run_id, exc_info=True)


def _event(run: Run, *, before: str, reason: str, message: str, actor: Actor, data: Any, at: datetime) -> RunEvent:
    return RunEvent(
        run_id=run.pk,
        from_status=before,
        to_status=run.status,
        reason=reason,
        message=message.replace("\x00", "\\x00"),
        data=data or {},
        actor_id=_actor_id(actor),
        created_at=at,
    )


def run_transition(
    *,
    run: Run,
    to: str,
    reason: str,
    message: str = "",
    actor: Actor = None,
    data: dict[str, Any] | None = None,
    fields: dict[str, Any] | None = None,
) -> None:
    """Move ``run`` (locked by the caller, inside ``transaction.atomic``) to ``to``.

    Refuses a move the table does not allow (``IllegalRunTransition``); writes the status,
    ``fields`` and a ``RunEvent`` (``reason``, ``message``, who: ``actor``) in the caller's
    transaction; watchers are told after commit.
    """
    before = run.status
    if to not in RUN_TRANSITIONS[before]:
        raise IllegalRunTransition(f"run {run} cannot go from {before} to {to} ({reason})")
    now = timezone.now()
    values = {"status": to, "updated_at": now, **(fields or {})}
    for key, value in values.items():
        setattr(run, key, value)
    event = _event(run, before=before, reason=reason, message=message, actor=actor, data=data, at=now)
    if is_postgresql():
        _update_with_event(run, values, event)
    else:
        Run.objects.filter(pk=run.pk).update(**values)
        event.save(force_insert=True)
    _publish(run)


def _update_with_event(run: Run, values: dict[str, Any], event: RunEvent) -> None:
    """The run's new values and its event in one statement (PostgreSQL): every run's start,
    suspension and end waits for it, and the ORM's update and insert were a round trip each."""
    fields = [_concrete(name) for name in values]
    quote = connection.ops.quote_name
    found = json_rows(RunEvent, [event])
    sets = ", ".join(f"{quote(field.column)} = %s" for field in fields)
    update = f"UPDATE {quote(Run._meta.db_table)} SET {sets} WHERE id = %s"  # noqa: S608 - the model's own columns
    sql = f"WITH u AS ({update}) {insert_select(RunEvent, found)}"
    params = [
        field.get_db_prep_save(value.pk if isinstance(value, Model) else value, connection)
        for field, value in zip(fields, values.values(), strict=True)
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, Run._meta.pk.get_db_prep_value(run.pk, connection), found.param])


def _concrete(name: str) -> Field[Any, Any]:
    """The run's column field ``name`` (a foreign key's too: it is written by its id)."""
    field = Run._meta.get_field(name)
    if not isinstance(field, Field) or not field.concrete:
        raise TypeError(f"run_transition writes a run's own columns, not {name!r}")
    return field


def run_audited(run: Run) -> dict[str, Any]:
    """A run's fields that the audit trail's digests cover (its inputs hold secret names only)."""
    return {
        "id": run.pk,
        "pipeline": run.pipeline_id,
        "number": run.number,
        "namespace": run.namespace,
        "inputs": run.inputs,
        "status": run.status,
        "record": run.record_id,
        "parent_run": run.parent_run_id,
    }


def run_audit(action: str, run: Run, *, actor: Actor, before: dict[str, Any] | None, **detail: Any) -> None:
    """The audit row of ``action`` on ``run`` (as it is now), in the caller's transaction."""
    audit.audit_write(**_audited_change(action, run, before, detail), actor=actor)


def _audited_change(action: str, run: Run, before: dict[str, Any] | None, detail: dict[str, Any]) -> dict[str, Any]:
    return {
        "action": action,
        "resource": "runs",
        "object_id": run.pk,
        "object_name": f"{run.pipeline.name}#{run.number}",
        "namespace": run.namespace,
        "before": before,
        "after": run_audited(run),
        "detail": detail,
    }


def run_created(*, run: Run, reason: str, message: str = "", actor: Actor = None) -> None:
    """The first event of a new run (its first status, who started it and how); told to watchers."""
    run_created_row(run=run, reason=reason, message=message, actor=actor).save(force_insert=True)
    _publish(run)


def run_created_row(*, run: Run, reason: str, message: str = "", actor: Actor = None) -> RunEvent:
    """``run_created``'s event, unsaved, for a start that writes it with the run (``run_told``)."""
    return _event(run, before="", reason=reason, message=message, actor=actor, data=None, at=run.created_at)


def run_told(run: Run) -> None:
    """Watchers hear of ``run`` once the transaction that wrote it commits."""
    _publish(run)


def run_audit_row(action: str, run: Run, *, actor: Actor, before: dict[str, Any] | None, **detail: Any) -> AuditEntry:
    """``run_audit``'s row, unsaved, for a start that writes it with the run."""
    return audit.audit_row(**_audited_change(action, run, before, detail), actor=actor)
