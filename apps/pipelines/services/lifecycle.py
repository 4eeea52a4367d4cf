"""A run's life after it started: the lease a worker holds to execute it, suspending and
waking, and its end.

Every exit path of a run (succeeded, failed, cancelled, timed out) requests deletion of the
run's record tree in the same transaction, so nothing it still owns survives it (I3).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.agents.models import AgentCommand
from apps.core import domain, workers
from apps.core.db import is_postgresql, prepared_cursor, uuid_array
from apps.core.errors import Conflict, GrapheneError
from apps.observability import metrics
from apps.pipelines.choices import ACTIVE, NOT_ENDED, TERMINAL, RunStatus
from apps.pipelines.models import Pipeline, Run, RunEvent, RunWait
from apps.pipelines.services import triggers
from apps.pipelines.services.definitions import definition_for_run
from apps.pipelines.services.transitions import (
    RUN_LEASE_SUBJECT,
    Actor,
    run_enqueue_on_commit,
    run_lock,
    run_lock_or_none,
    run_take_queued,
    run_transition,
)
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Record

# --- the lease --------------------------------------------------------------------------------


def run_lease_acquire(*, run_id: Any) -> tuple[Run, uuid.UUID] | None:
    """Take the run's execution lease: it is queued, its previous holder's lease expired, or
    its timer is due. Returns the run (now ``running``) and the lease's token, which fences
    every journal write of this execution; ``None`` when there is nothing to execute. A worker
    notes that it holds the token (``workers.lease_hold``): if the worker is lost, the run is
    taken over at once (``recovery.runs_take_over``) instead of when the lease expires."""
    now = timezone.now()
    if is_postgresql():  # a queued run, most often: one statement
        token = uuid.uuid4()
        lease = timedelta(seconds=settings.GRAPHENE_RUN_LEASE_SECONDS)
        worker = workers.current_worker_id()
        taken = run_take_queued(run_id=run_id, token=token, lease=lease, worker_id=worker)
        if taken is False:  # its start rolled back
            return None
        if taken is not True:
            return taken, token
    with transaction.atomic():
        # With its pipeline's row (not locked): the execution needs its name and policies.
        run = run_lock_or_none(run_id)
        if run is None:
            return None
        expired = run.status == RunStatus.RUNNING and (run.lease_expires_at is None or run.lease_expires_at < now)
        timer_due = run.status == RunStatus.SUSPENDED and run.wake_at is not None and run.wake_at <= now
        if run.status != RunStatus.QUEUED and not expired and not timer_due:
            return None
        token = uuid.uuid4()
        data: dict[str, Any] = {"attempt": run.attempt + 1}
        if expired:
            reason = "LeaseTakenOver"  # its worker died or stalled
        elif timer_due:
            reason = "TimerDue"
        elif run.started_at is None:
            reason = "Started"
        elif RunEvent.objects.filter(run=run).order_by("-id").values_list("reason", flat=True).first() == "WorkerLost":
            reason = "Resumed"  # its worker was lost while executing it (recovery.runs_take_over)
            worker = workers.current_worker_id()
            data["worker"] = workers.worker_describe(worker) if worker is not None else None
        else:
            reason = "Continued"
        run_transition(
            run=run,
            to=RunStatus.RUNNING,
            reason=reason,
            data=data,
            fields={
                "lease_token": token,
                "lease_expires_at": now + timedelta(seconds=settings.GRAPHENE_RUN_LEASE_SECONDS),
                "attempt": run.attempt + 1,
                "started_at": run.started_at or now,
                "waiting_on": [],
                "wake_at": None,
            },
        )
        workers.lease_hold(token=token, subject=f"{RUN_LEASE_SUBJECT}{run.pk}")
    return run, token


def run_suspend(
    *,
    run_id: Any,
    token: uuid.UUID,
    waiting_on: list[str],
    wake_at: datetime | None,
    until: Callable[[], bool] | None = None,
) -> None:
    """The execution holding ``token`` lets go of its worker until a target in ``waiting_on``
    settles (or ``until()`` holds, when given) or ``wake_at`` comes. If that has happened
    already, the run is queued again at once."""

    def happened() -> bool:
        if until is not None:
            return until()
        return bool(waiting_on) and bool(targets_settled(waiting_on))

    with transaction.atomic():
        run = run_lock(run_id)
        if run.lease_token != token or run.status != RunStatus.RUNNING:
            return
        RunWait.objects.filter(run=run).delete()
        RunWait.objects.bulk_create([RunWait(run=run, target=target) for target in waiting_on])
        settled = happened()
        due = wake_at is not None and wake_at <= timezone.now()
        if settled or due:
            # What we wait for happened while we were unwinding: go again at once.
            RunWait.objects.filter(run=run).delete()
            run_transition(
                run=run,
                to=RunStatus.QUEUED,
                reason="WokenWhileSuspending",
                fields={"lease_token": None, "lease_expires_at": None},
            )
            run_enqueue_on_commit(run.pk)
            return
        run_transition(
            run=run,
            to=RunStatus.SUSPENDED,
            reason="Suspended",
            data={"waiting_on": waiting_on, "wake_at": wake_at.isoformat() if wake_at else None},
            fields={"lease_token": None, "lease_expires_at": None, "waiting_on": waiting_on, "wake_at": wake_at},
        )
        if wake_at is not None:
            run_enqueue_on_commit(run.pk, countdown=max(0.0, (wake_at - timezone.now()).total_seconds()))
    # A target that settled while the transaction above ran looked for our RunWait rows before
    # they were committed and found none: its wake-up is lost. Looking again after our commit
    # closes the gap — whatever settles later finds the rows.
    if waiting_on and happened():
        runs_wake(targets=waiting_on)


# --- waking -----------------------------------------------------------------------------------


def runs_wake(*, targets: Iterable[Any]) -> int:
    """Records or child runs settled: re-queue the suspended runs waiting for any of them."""
    run_ids = _waiting_on(list(targets))
    woken = 0
    for run_id in sorted(run_ids):
        with transaction.atomic():
            run = Run.objects.select_for_update(no_key=True).filter(pk=run_id).first()
            if run is None or run.status != RunStatus.SUSPENDED:
                continue
            RunWait.objects.filter(run=run).delete()
            run_transition(run=run, to=RunStatus.QUEUED, reason="Woken", fields={"waiting_on": [], "wake_at": None})
            run_enqueue_on_commit(run.pk)
            woken += 1
    return woken


def _waiting_on(targets: list[Any]) -> set[Any]:
    """The runs waiting for any of ``targets``. On PostgreSQL one prepared statement, the ids as
    one array: every deletion batch and settled convergence asks, almost always finding none."""
    if not targets:
        return set()
    if not is_postgresql():
        return set(RunWait.objects.filter(target__in=targets).values_list("run_id", flat=True))
    with prepared_cursor() as cursor:
        cursor.execute("SELECT DISTINCT run_id FROM pipelines_runwait WHERE target = ANY(%s)", [uuid_array(targets)])
        return {run_id for (run_id,) in cursor.fetchall()}


def runs_wake_on_records(event: domain.RecordsSettled) -> None:
    """Subscriber: records settled; the runs suspended on one of them go again."""
    runs_wake(targets=event.record_ids)


def runs_wake_on_command(event: domain.CommandFinished) -> None:
    """Subscriber: an agent command a run waits on (``exec``, ``call`` ...) ended."""
    if event.waiting_record_id is None and not event.awaited_in_place:
        runs_wake(targets=[event.command_id])


def targets_settled(targets: Iterable[Any]) -> set[str]:
    """Which of these record, run or command ids have settled (a record no longer
    converging, a run ended, a command finished)."""
    ids = [str(t) for t in targets]
    done = {
        str(pk)
        for pk in Record.objects.filter(pk__in=ids)
        .exclude(phase__in=[Phase.PENDING, Phase.CREATING, Phase.UPDATING], deletion_requested_at__isnull=True)
        .values_list("pk", flat=True)
    }
    done |= {str(pk) for pk in Run.objects.filter(pk__in=ids, status__in=list(TERMINAL)).values_list("pk", flat=True)}
    done |= {
        str(pk)
        for pk in AgentCommand.objects.filter(pk__in=ids, finished_at__isnull=False).values_list("pk", flat=True)
    }
    return done


# --- the end ----------------------------------------------------------------------------------


def stand_get(pipeline_name: str, *, namespace: str = "default") -> Record:
    """The pipeline's stand: a root record in the pipeline's namespace that holds what runs hand
    over (created on demand)."""
    return records.record_ensure_root(kind="graphene.stand", name=pipeline_name, namespace=namespace)


def _hand_to_stand(run: Run, keep_for: timedelta) -> tuple[int, list[str]]:
    """Give everything the run's root still owns to the stand, each part with a TTL.

    A part the stand cannot take (it already holds one of that kind and name, from an
    earlier run) is deleted with the run instead, and named in the returned list.
    """
    stand = stand_get(run.pipeline.name, namespace=run.namespace)
    until = timezone.now() + keep_for
    kept, refused = 0, []
    for child in Record.objects.filter(parent_id=run.record_id).exclude(phase=Phase.DELETED).order_by("lft"):
        if child.deletion_requested_at is not None:
            continue
        try:
            with transaction.atomic():
                records.record_transfer(record=child, new_owner=stand, expires_at=until)
        except Conflict as exc:
            refused.append(f"{child.kind}/{child.name}: {exc.detail}")
        else:
            kept += 1
    return kept, refused


_FINISH_REASONS: dict[str, str] = {
    RunStatus.SUCCEEDED: "Succeeded",
    RunStatus.FAILED: "Failed",
    RunStatus.CANCELLED: "Cancelled",
    RunStatus.TIMED_OUT: "DeadlineExceeded",
}


def run_finish(
    *,
    run: Run,
    status: str,
    outputs: Any = None,
    error: str = "",
    token: Any = None,
    keep_for: timedelta | None = None,
    reason: str = "",
    actor: Actor = None,
) -> bool:
    """End a run and delete everything it still owns (I3); its child runs end with it.

    ``token`` fences a worker's own finish (only the lease holder may end a running run).
    ``keep_for`` (a failed run's ``keep_on_failure``) first hands what it owns to the stand.
    ``reason`` and ``actor`` go in the run's event (the reason defaults to the status's).
    Returns False when the run had ended already or the token no longer holds the lease.
    """
    assert status in TERMINAL
    error = error.replace("\x00", "\\x00")  # PostgreSQL text cannot hold NUL (an exception's message may)
    with transaction.atomic():
        # Its root record locked with it (the end asks its deletion below), unless a failed run
        # hands records to the stand first (that locks the two trees in its own order).
        run = run_lock(run.pk, with_root=not (keep_for and status == RunStatus.FAILED))
        if run.status in TERMINAL or (
            token is not None and (run.lease_token != token or run.status != RunStatus.RUNNING)
        ):
            return False
        if keep_for and status == RunStatus.FAILED and run.record_id:
            kept, refused = _hand_to_stand(run, keep_for)
            if kept:
                error = f"{error}\n(kept {kept} record(s) on the stand {run.pipeline.name!r} for {keep_for})".lstrip()
            if refused:
                error = f"{error}\n(not kept, deleted with the run: {'; '.join(refused)})"
        # First of this transaction's hooks: once it commits, the runs its end starts are
        # started before watchers are told and before the deletion of its tree is sent.
        firings = triggers.firings_on_commit()
        was_suspended = run.status == RunStatus.SUSPENDED  # only a suspended run has RunWait rows
        finished_at = timezone.now()
        if run.started_at is not None:  # every way a run ends (cancel, timeout too)
            seconds = (finished_at - run.started_at).total_seconds()
            metrics.observe(metrics.RUN_DURATION_SECONDS, seconds, pipeline=run.pipeline.name, status=status)
        lines = error.strip().splitlines()
        run_transition(
            run=run,
            to=status,
            reason=reason or _FINISH_REASONS[status],
            message=lines[-1] if lines else "",
            actor=actor,
            fields={
                "outputs": outputs,
                "error": error,
                "finished_at": finished_at,
                "lease_token": None,
                "lease_expires_at": None,
                "waiting_on": [],
                "wake_at": None,
            },
        )
        if was_suspended:
            RunWait.objects.filter(run=run).delete()
        if run.record_id is not None:
            root = run.record if Run.record.is_cached(run) else None
            records.root_delete_request(
                root_id=run.record_id, reason=f"Run{status.title().replace('_', '')}", locked=root
            )
        for child in _children_not_ended(run):
            run_finish(
                run=child,
                status=RunStatus.CANCELLED,
                error=f"its parent run {run} ended ({status})",
                reason="ParentEnded",
            )
        if run.parent_run_id is not None:
            _promote_sibling(run)
            targets = [str(run.pk)]
            transaction.on_commit(lambda: runs_wake(targets=targets))  # the parent waits on its children
        elif run.pipeline.concurrency == "queue":
            _promote_next_in_line(run.pipeline_id)
        # Last: after any pipeline row lock above, as activation takes them (pipelines, then triggers).
        triggers.upstream_ended(run, firings)
    return True


def _children_not_ended(run: Run) -> list[Run]:
    """The child runs of ``run`` that have not ended, oldest first. Most runs start none: a
    raw existence check first (every run's end waits for it; the queryset compiled slower than
    it ran)."""
    statuses = sorted(NOT_ENDED)
    placeholders = ", ".join(["%s"] * len(statuses))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM pipelines_run WHERE parent_run_id = %s AND status IN ({placeholders}) LIMIT 1",  # noqa: S608 - placeholders only
            [Run._meta.pk.get_db_prep_value(run.pk, connection), *statuses],
        )
        if cursor.fetchone() is None:
            return []
    return list(Run.objects.filter(parent_run=run, status__in=list(NOT_ENDED)).order_by("number"))


def run_promote(run: Run, *, reason: str) -> None:
    """A waiting run (locked by the caller) takes its turn: queued, with its deadline from now."""
    deadline = None
    try:
        definition = definition_for_run(run)
    except GrapheneError:  # its code is gone: it fails when it executes, with the reason
        definition = None
    if definition is not None and definition.timeout:
        deadline = timezone.now() + definition.timeout
    run_transition(run=run, to=RunStatus.QUEUED, reason=reason, fields={"deadline_at": deadline})
    run_enqueue_on_commit(run.pk)


def _promote_next_in_line(pipeline_id: Any) -> None:
    """``queue`` pipelines: when no run holds the turn, the oldest waiting run takes it."""
    Pipeline.objects.select_for_update().get(pk=pipeline_id)
    if Run.objects.filter(pipeline_id=pipeline_id, parent_run__isnull=True, status__in=list(ACTIVE)).exists():
        return
    nxt = (
        Run.objects.select_for_update(no_key=True)
        .filter(pipeline_id=pipeline_id, parent_run__isnull=True, status=RunStatus.WAITING)
        .order_by("number")
        .first()
    )
    if nxt is not None:
        run_promote(nxt, reason="TurnCame")


def _promote_sibling(child: Run) -> None:
    """``run_all``: a child ended, so the next waiting sibling of its group may start."""
    run_lock(child.parent_run_id)  # serializes promotions among siblings
    nxt = (
        Run.objects.select_for_update(no_key=True)
        .filter(parent_run_id=child.parent_run_id, group=child.group, status=RunStatus.WAITING)
        .order_by("group_index")
        .first()
    )
    if nxt is not None:
        run_promote(nxt, reason="SiblingEnded")
