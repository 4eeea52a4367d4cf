"""Starting runs (with the pipeline's concurrency policy), child runs, cancelling, resuming."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Max, QuerySet
from django.utils import timezone
from graphene_sdk import Pipeline as Definition

from apps.core import access
from apps.core.db import (
    insert_json_groups,
    is_postgresql,
    json_rows,
    sequence_next,
    sequences_next,
)
from apps.core.errors import Conflict, GrapheneError, NotFound, ValidationFailed
from apps.core.models import AuditEntry
from apps.pipelines.causes import cause_text, parent_cause, user_cause
from apps.pipelines.choices import ACTIVE, TERMINAL, RunStatus
from apps.pipelines.models import Pipeline, Revision, Run, RunEvent, RunWait, Trigger
from apps.pipelines.services.definitions import (
    definition_for_run,
    definition_get,
    definition_lookup,
    inputs_validate,
    pipeline_row_with,
    pipeline_sync,
)
from apps.pipelines.services.lifecycle import run_finish
from apps.pipelines.services.transitions import (
    Actor,
    run_audit,
    run_audit_row,
    run_audited,
    run_created,
    run_created_row,
    run_enqueue_before_commit,
    run_enqueue_on_commit,
    run_lock,
    run_start_lock_key,
    run_told,
    run_transition,
)
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import TREE_ID_SEQUENCE, Event, Record


def _create_run(
    *,
    definition: Definition[Any, Any],
    row: Pipeline,
    inputs: dict[str, Any],
    status: str,
    reason: str,
    actor: Actor = None,
    parent: Run | None = None,
    group: int | None = None,
    group_index: int | None = None,
    idempotency_key: str | None = None,
    revision: Revision | None = None,
    cause: dict[str, Any] | None = None,
    trigger: Trigger | None = None,
    numbers: tuple[int, int] | None = None,
    run_id: uuid.UUID | None = None,
    sent: bool = False,
) -> Run:
    """``sent``: the run ``run_id`` went to a worker already (``run_enqueue_before_commit``),
    under ``run_start_lock_key(run_id)`` taken with its numbers; else a queued run is sent once
    the caller's transaction commits."""
    pg = is_postgresql()
    if pg:  # the run's number and its tree's in one round trip (or drawn with the pipeline's row)
        number, tree_id = numbers or _numbers_next(row)
        root, root_event = records.run_root_rows(
            record_id=run_id or uuid.uuid4(),
            name=f"{row.name}#{number}",
            namespace=row.namespace,
            tree_id=tree_id,
            actor=actor,
        )
    else:
        number = run_number_next(row)
        root = records.record_create_root(
            kind="graphene.run", name=f"{row.name}#{number}", namespace=row.namespace, actor=actor
        )
    if status == RunStatus.QUEUED and not sent:
        # Before the run's own notifications: after the commit a worker is told first, watchers next.
        run_enqueue_on_commit(root.pk)
    deadline = timezone.now() + definition.timeout if definition.timeout and status == RunStatus.QUEUED else None
    run = Run(
        id=root.pk,
        pipeline=row,
        number=number,
        record=root,
        namespace=row.namespace,
        inputs=inputs,
        status=status,
        deadline_at=deadline,
        created_by=actor if actor is not None and actor.is_authenticated else None,  # type: ignore[misc]
        parent_run=parent,
        group=group,
        group_index=group_index,
        idempotency_key=idempotency_key,
        revision=revision,
        cause=cause if cause is not None else (parent_cause(parent) if parent is not None else user_cause(actor)),
        trigger=trigger,
    )
    message = f"started by {cause_text(run.cause)}" if run.cause.get("type") not in ("user", "system") else ""
    if not pg:
        run.save(force_insert=True)
        run_created(run=run, reason=reason, message=message, actor=actor)
        run_audit("run.start", run, actor=actor, before=None, status=status)
        return run
    # One statement for the root, the run, their first events and the audit row (each had its
    # round trip and ORM insert). The run's JSON first: its event is stamped at its created_at.
    rows = [(Record, json_rows(Record, [root])), (Event, json_rows(Event, [root_event])), (Run, json_rows(Run, [run]))]
    event = run_created_row(run=run, reason=reason, message=message, actor=actor)
    audit_row = run_audit_row("run.start", run, actor=actor, before=None, status=status)
    insert_json_groups(
        [*rows, (RunEvent, json_rows(RunEvent, [event])), (AuditEntry, json_rows(AuditEntry, [audit_row]))]
    )
    run._state.adding, run._state.db = False, connection.alias
    records.run_root_written(root)
    run_told(run)
    return run


def _run_number_sequence(row: Pipeline) -> str:
    return f"pipelines_run_number_{int(row.pk)}"


def _numbers_next(row: Pipeline, lock: int | None = None) -> tuple[int, int]:
    """A new run's number and its tree's id (PostgreSQL), with the advisory lock ``lock``
    taken in the same round trip when given."""
    number, tree_id = sequences_next(
        [(_run_number_sequence(row), _RUN_NUMBER_TAKEN, [row.pk]), (TREE_ID_SEQUENCE, _TREE_ID_TAKEN, [])],
        lock=lock,
    )
    return number, tree_id


def _start_row(
    definition: Definition[Any, Any], *, seen: Pipeline | None, turns: bool, lock: int | None
) -> tuple[Pipeline, tuple[int, int] | None]:
    """The pipeline's row for a start (``pipeline_sync``; locked when the start ``turns``), and,
    for a ``parallel`` start on PostgreSQL, the new run's number and its tree's id, drawn with
    the advisory lock ``lock`` (when given) taken in the same statement: the one that reads the
    row when it was not read yet (one round trip fewer on every start)."""
    if turns or not is_postgresql():
        return pipeline_sync(definition, row=None if turns else seen, lock=turns), None
    found = None
    if seen is None:
        extra = (_NUMBERS_DRAWN,) if lock is None else (_NUMBERS_DRAWN_LOCKED, [lock])
        found = pipeline_row_with(definition.name, *extra)
    if found is None:  # read already (a delivered revision's, a trigger's), or its first start: made
        row = pipeline_sync(definition, row=seen)
        return row, _numbers_next(row, lock)
    row, (number, tree_id, *_) = found
    row = pipeline_sync(definition, row=row)
    if number is None or tree_id is None:  # a sequence is made on first use
        return row, _numbers_next(row)
    return row, (int(number), int(tree_id))


_RUN_NUMBER_TAKEN = "SELECT MAX(number) FROM pipelines_run WHERE pipeline_id = %s"
_TREE_ID_TAKEN = "SELECT MAX(tree_id) FROM records_record"
# A new run's number and its tree's id, drawn with the pipeline's row (NULL while a sequence
# is not made yet, as ``sequences_next`` reads them).
_NUMBERS_DRAWN = (
    "nextval(to_regclass('pipelines_run_number_' || pipelines_pipeline.id)), "
    f"nextval(to_regclass('{TREE_ID_SEQUENCE}'))"
)
_NUMBERS_DRAWN_LOCKED = f"{_NUMBERS_DRAWN}, pg_advisory_xact_lock(%s::bigint)"


def run_number_next(row: Pipeline) -> int:
    """The next number of a run of pipeline ``row``: unique, increasing, gaps allowed (a start
    that rolls back leaves its number unused). On PostgreSQL a sequence per pipeline, so that
    starts of a ``parallel`` pipeline never wait for each other to number their runs; on
    SQLite the highest number + 1 (its write lock serializes the starts)."""
    if not is_postgresql():
        return (Run.objects.filter(pipeline=row).aggregate(n=Max("number"))["n"] or 0) + 1
    return sequence_next(_run_number_sequence(row), taken=_RUN_NUMBER_TAKEN, params=[row.pk])


# Concurrency policies whose starts decide from the pipeline's other runs, under its row lock.
TAKES_TURNS = ("queue", "cancel_previous")


class IdempotencyKeyReused(GrapheneError):
    """The key started a run with other inputs: the client reused a key for another start."""

    status_code = 422
    code = "idempotency_key_reused"


IDEMPOTENCY_KEY_MAX = 255


def idempotency_key_check(key: str) -> str:
    """A key as clients send it: 1 to 255 printable ASCII characters (a UUID, a build id)."""
    if not (0 < len(key) <= IDEMPOTENCY_KEY_MAX) or not all(" " < c <= "~" for c in key):
        raise ValidationFailed(
            f"Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_MAX} printable ASCII characters without spaces "
            "(a UUID or a CI build id)",
            fields={"Idempotency-Key": ["1-255 printable ASCII characters, no spaces"]},
        )
    return key


def _replay(row: Pipeline, key: str, inputs: dict[str, Any]) -> Run | None:
    """The run this key already started, if any; a key reused with other inputs is refused."""
    earlier = Run.objects.filter(pipeline=row, idempotency_key=key).select_related("pipeline").first()
    if earlier is None:
        return None
    if earlier.inputs != inputs:
        raise IdempotencyKeyReused(
            f"Idempotency-Key {key!r} already started run {earlier} with other inputs; "
            "use a new key for a different start",
            fields={"Idempotency-Key": ["already used with other inputs"]},
        )
    earlier.replayed = True  # type: ignore[attr-defined]  # read by the API: the answer is a replay
    return earlier


def run_start(
    *,
    pipeline_name: str,
    inputs: Any,
    actor: Actor = None,
    idempotency_key: str | None = None,
    revision: Revision | None = None,
    cause: dict[str, Any] | None = None,
    trigger: Trigger | None = None,
) -> Run:
    """Validate the inputs, apply the pipeline's concurrency policy, create the run, enqueue it.

    ``queue``: the run waits its turn behind the active one (refused beyond ``max_pending``);
    ``cancel_previous``: active runs are cancelled (and cleaned up) first.

    ``idempotency_key``: a start that already happened with this key (and these inputs)
    returns its run, marked ``replayed``, and changes nothing (no policy applied again); with
    other inputs it is ``IdempotencyKeyReused`` (422). The key is stored with the run, in the
    transaction that creates it.

    The run executes (and always replays) the pipeline's active revision as it is now, or
    ``revision`` (a draft: a revision that is not active); a pipeline installed on the workers
    has none.

    ``cause`` and ``trigger``: why it starts, when not a person (``actor``) started it
    (apps/pipelines/causes.py).
    """
    if idempotency_key is not None:
        idempotency_key_check(idempotency_key)
    if revision is not None and pipeline_name not in revision.pipeline_names():
        raise NotFound(
            f"revision {revision.short} defines no pipeline {pipeline_name!r}; "
            f"it defines: {', '.join(revision.pipeline_names()) or 'none'}"
        )
    # A trigger's pipeline row came with its firing: a triggered start reads it no more.
    known = trigger.pipeline if trigger is not None else None
    definition, seen = definition_lookup(pipeline_name, user=actor, revision=revision, row=known)
    if actor is not None:
        access.require(actor, "start", "runs", definition.namespace)
    clean = inputs_validate(definition, inputs)
    # ``queue`` and ``cancel_previous`` decide from the pipeline's other runs: their starts take
    # the pipeline's row lock, one after the other. ``parallel`` starts decide nothing from each
    # other and never wait for one another: their numbers come from a sequence, and two starts
    # with one idempotency key meet at its unique constraint (the loser answers the winner's run).
    turns = definition.concurrency in TAKES_TURNS
    row: Pipeline | None = None
    outermost = not connection.in_atomic_block  # its commit ends the start
    run_id = uuid.uuid4()
    # A parallel start that is its own transaction sends its run to a worker as soon as the
    # statement drawing its numbers has taken the run's start lock (``run_enqueue_before_commit``):
    # the message's way to the worker overlaps the rows' making, their writing and the commit.
    lock = run_start_lock_key(run_id) if outermost and not turns and is_postgresql() else None
    try:
        with transaction.atomic():
            while True:
                # Unlocked, the row just read serves (read again, it would be no fresher).
                row, numbers = _start_row(definition, seen=seen, turns=turns, lock=lock)
                pinned = revision or row.revision
                if pinned is not None and revision is None:
                    # The revision active now (activation may have moved it since ``definition_get``).
                    current = definition_get(pipeline_name, revision=pinned)
                    if current is not definition:
                        definition, clean = current, inputs_validate(current, inputs)
                if turns or definition.concurrency not in TAKES_TURNS:
                    break
                turns = True  # the revision activated meanwhile takes turns: read the row again, locked
            # A trigger's firing is almost always a first start of its key (a second try of the
            # same firing is rare): a ``parallel`` one skips the look-up and meets an earlier
            # start at the key's unique constraint (below), as concurrent starts do.
            looks_up = trigger is None or turns
            if idempotency_key is not None and looks_up and (earlier := _replay(row, idempotency_key, clean)):
                return earlier
            # Not when the revision activated meanwhile takes turns (the loop above): its run may wait.
            sent = lock is not None and not turns
            if sent:
                run_enqueue_before_commit(run_id)
            status, reason = RunStatus.QUEUED, "Started"
            if definition.concurrency == "queue":
                waiting = Run.objects.filter(pipeline=row, parent_run__isnull=True, status=RunStatus.WAITING).count()
                if _active_runs(row).exists() or waiting:
                    if definition.max_pending is not None and waiting >= definition.max_pending:
                        raise Conflict(
                            f"pipeline {row.name!r} runs one at a time and already has {waiting} run(s) waiting "
                            f"(max_pending={definition.max_pending}); wait for one to finish or cancel one",
                            code="concurrency_limit",
                        )
                    status, reason = RunStatus.WAITING, "WaitingForTurn"
            elif definition.concurrency == "cancel_previous":
                for previous in _active_runs(row).order_by("number"):
                    run_finish(
                        run=previous,
                        status=RunStatus.CANCELLED,
                        error="cancelled: a newer run of the pipeline started",
                        reason="NewerRunStarted",
                        actor=actor,
                    )
            return _create_run(
                definition=definition,
                row=row,
                inputs=clean,
                status=status,
                reason=reason,
                actor=actor,
                idempotency_key=idempotency_key,
                revision=pinned,
                cause=cause,
                trigger=trigger,
                numbers=numbers,
                run_id=run_id,
                sent=sent,
            )
    except IntegrityError:
        # A concurrent start with this key committed first (``parallel``: nothing serialized the two).
        if row is None or idempotency_key is None or (earlier := _replay(row, idempotency_key, clean)) is None:
            raise
        return earlier


def _active_runs(row: Pipeline) -> QuerySet[Run]:
    """The pipeline's top-level runs that hold its turn (built only for a policy that takes
    turns: compiling the queryset cost a ``parallel`` start more than its statements)."""
    return Run.objects.filter(pipeline=row, parent_run__isnull=True, status__in=list(ACTIVE))


def run_start_children(
    *, parent: Run, pipeline_name: str, inputs: list[Any], concurrency: int, group: int
) -> list[Run]:
    """Start the child runs of a ``run_all``: the first ``concurrency`` queued, the rest waiting.
    A child runs its pipeline from the parent's own revision when that defines it, else from
    the pipeline's active revision (each child keeps the one it started on)."""
    revision = parent.revision if parent.revision_id and pipeline_name in parent.revision.pipeline_names() else None  # type: ignore[union-attr]
    definition = definition_get(pipeline_name, revision=revision)
    if definition.namespace != parent.namespace:
        raise access.AccessDenied(
            f"run {parent} (namespace {parent.namespace!r}) may not start pipeline {pipeline_name!r} "
            f"of namespace {definition.namespace!r}: runs start child runs only in their own namespace"
        )
    clean = [inputs_validate(definition, item) for item in inputs]
    row = pipeline_sync(definition)  # no lock: the children's numbers come from a sequence
    if revision is None and row.revision_id is not None:
        revision = row.revision
        definition = definition_get(pipeline_name, revision=revision)
    return [
        _create_run(
            definition=definition,
            row=row,
            inputs=item,
            status=RunStatus.QUEUED if index < concurrency else RunStatus.WAITING,
            reason="Started" if index < concurrency else "WaitingForSiblings",
            parent=parent,
            group=group,
            group_index=index,
            # Derived from the cause: a replayed parent can never start the same child twice.
            idempotency_key=f"child:{parent.pk}:{group}:{index}",
            revision=revision,
        )
        for index, item in enumerate(clean)
    ]


def run_cancel(*, run: Run, actor: Actor = None) -> Run:
    """Cancel: the run ends now and its tree is deleted; a worker still executing it is fenced off."""
    access.require_actor(actor, "cancel", "runs", run.namespace)
    who = actor.get_username() if actor is not None and actor.is_authenticated else "system"
    with transaction.atomic():
        before = run_audited(run_lock(run.pk))
        ended = run_finish(run=run, status=RunStatus.CANCELLED, error=f"cancelled by {who}", actor=actor)
        run = Run.objects.select_related("pipeline").get(pk=run.pk)
        if ended:  # a run that had ended already is left as it was: nothing to record
            run_audit("run.cancel", run, actor=actor, before=before)
    return run


def run_resume(*, run: Run, actor: Actor = None) -> Run:
    """Run again by replay: journaled calls return their results, nothing journaled is redone.

    A suspended run is woken now. An ended run (not a successful one) gets a new root record
    if its old tree is gone, since what it owned was deleted when it ended.
    """
    access.require_actor(actor, "resume", "runs", run.namespace)
    with transaction.atomic():
        run = run_lock(run.pk)
        if run.status == RunStatus.SUCCEEDED:
            raise Conflict(f"run {run} succeeded; start a new run instead of resuming it")
        if run.status in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING):
            return run
        before = run_audited(run)
        fields: dict[str, Any] = {"waiting_on": [], "wake_at": None}
        if run.status in TERMINAL:
            root = Record.objects.filter(pk=run.record_id).first() if run.record_id else None
            if root is None or root.phase == Phase.DELETED or root.deletion_requested_at is not None:
                # The new tree's root names its run: the run's id is its first root's id only.
                root = records.record_create_root(
                    kind="graphene.run",
                    name=f"{run.pipeline.name}#{run.number}",
                    spec={"run": str(run.pk)},
                    actor=actor,
                )
            fields |= {"record": root, "finished_at": None, "error": "", "outputs": None}
            definition = definition_for_run(run)
            if definition.timeout:
                fields["deadline_at"] = timezone.now() + definition.timeout
        RunWait.objects.filter(run=run).delete()
        run_transition(run=run, to=RunStatus.QUEUED, reason="Resumed", actor=actor, fields=fields)
        run_audit("run.resume", run, actor=actor, before=before)
        run_enqueue_on_commit(run.pk)
    return run
