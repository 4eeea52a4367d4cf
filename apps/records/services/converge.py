"""Convergence: a record's object brought to its spec through its kind's adopt-or-create,
retried with backoff, moved away from an old place first."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.core import domain, workers
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from apps.records.services.drift import _next_observe
from apps.records.services.placement import _left_behind, _place, _place_text
from apps.records.services.transitions import (
    _CONVERGIBLE,
    _enqueue_converge_on_commit,
    _error_text,
    _event_kwargs,
    _lease,
    _transition,
    backoff_seconds,
    operation_lock,
    operation_resumed_tell,
    record_event_write,
)
from kinds import KindError, NotYet, PermanentError, UnknownKind, Waiting, get_kind


def _move_away(record: Record) -> bool:
    """Remove the object from the place ``record`` moved away from, before it is made at the
    new one. False: not done (retried later, or counted as a failed attempt)."""
    old = _left_behind(record)
    if old is None:
        return True
    place = _place(record.kind, old.spec)
    try:
        get_kind(record.kind).delete(old)
    except NotYet as wait:
        _converge_later(record_id=record.pk, retry_in=wait.retry_in)
        return False
    except Exception as exc:
        why = f"removing it from where it was ({_place_text(place)}): {_error_text(exc)}"
        error = PermanentError(why) if isinstance(exc, PermanentError) else KindError(why)
        _converge_failed(record_id=record.pk, error=error)
        return False
    with transaction.atomic():
        fresh = Record.objects.select_for_update(no_key=True).filter(pk=record.pk).first()
        if fresh is not None and fresh.moved_from == record.moved_from:
            Record.objects.filter(pk=record.pk).update(moved_from=None)
            to = _place(record.kind, fresh.spec)
            record_event_write(
                record.pk,
                EventType.NOTE,
                reason="MovedAway",
                message=f"removed from {_place_text(place)}; to be made at {_place_text(to)}",
                data={"from": place, "to": to},
            )
    record.moved_from = None
    return True


def record_converge(*, record_id: Any) -> None:
    """Bring one record's external object to its spec through the kind's adopt-or-create."""
    started_at = timezone.now()
    with operation_lock(record_id):
        with transaction.atomic():
            record = Record.objects.select_for_update(no_key=True).filter(pk=record_id).first()
            if record is None or record.deletion_requested_at is not None or record.phase not in _CONVERGIBLE:
                return
            generation = record.generation
            worker = workers.current_worker_id()
            fields = {"next_attempt_at": timezone.now() + _lease(), "held_by": worker}
            if record.phase == Phase.PENDING:
                _transition([record], Phase.CREATING, reason="Converging", fields=fields)
            else:
                Record.objects.filter(pk=record.pk).update(**fields)
            if record.held_by is not None and record.held_by != worker:
                operation_resumed_tell(record.pk, previous=record.held_by, worker=worker, what="convergence")
        if not _move_away(record):
            return
        try:
            outputs = get_kind(record.kind).create(record)
        except NotYet as wait:
            _converge_later(
                record_id=record_id, retry_in=wait.retry_in, waiting=str(wait) if isinstance(wait, Waiting) else None
            )
            return
        except Exception as exc:
            failed = domain.RecordConvergeFailed(
                record=record.ref(), started_at=started_at, ended_at=timezone.now(), error=_error_text(exc)
            )
            domain.emit(failed)  # outside a transaction: delivered now, before the failure settles the record
            _converge_failed(record_id=record_id, error=exc)
            return
        with transaction.atomic():
            record = Record.objects.select_for_update(no_key=True).get(pk=record_id)
            if record.deletion_requested_at is not None or record.phase not in _CONVERGIBLE:
                # Deletion began meanwhile: keep what we learned; the delete will remove it.
                Record.objects.filter(pk=record.pk).update(outputs=outputs, held_by=None)
                return
            if record.generation != generation:
                Record.objects.filter(pk=record.pk).update(outputs=outputs, held_by=None)
                _enqueue_converge_on_commit(record.pk)
                return
            now = timezone.now()
            domain.emit(
                domain.RecordConverged(
                    record=record.ref(),
                    started_at=started_at,
                    ended_at=now,
                    created=record.phase != Phase.UPDATING,
                    adopted=bool(outputs.get("adopted")) if isinstance(outputs, dict) else False,
                    healed=record.healing,
                )
            )
            reason = "Healed" if record.healing else "Updated" if record.phase == Phase.UPDATING else "Created"
            _transition(
                [record],
                Phase.READY,
                reason=reason,
                data={"adopted": bool(outputs.get("adopted"))} if isinstance(outputs, dict) else None,
                fields={
                    "outputs": outputs,
                    "observed_generation": generation,
                    "attempts": 0,
                    "next_attempt_at": None,
                    "held_by": None,
                    "last_error": "",
                    "healing": False,
                    "heals": record.heals + (1 if record.healing else 0),
                    "observed_at": now,
                    "next_observe_at": _next_observe(record, now, soon=True),
                },
            )


def record_wake(*, record_id: Any) -> None:
    """What a record's kind waited on (``NotYet``) has happened: run its convergence or its
    deletion again now. A hint only: without it, the retry the kind asked for comes later."""
    from apps.records.tasks import records_delete_task

    record = Record.objects.filter(pk=record_id).values("phase", "deletion_requested_at").first()
    if record is None or record["phase"] == Phase.DELETED:
        return
    if record["deletion_requested_at"] is not None:
        if record["phase"] == Phase.DELETING:
            records_delete_task.delay([str(record_id)])
    elif record["phase"] in _CONVERGIBLE:
        from apps.records.tasks import record_converge_task

        record_converge_task.delay(str(record_id))


def _converge_later(*, record_id: Any, retry_in: float, waiting: str | None = None) -> None:
    """The kind's work goes on elsewhere: look again later (or when it wakes us), no attempt counted.

    ``waiting`` (a kind's ``Waiting``): what the record waits on, told in its history as a
    ``Waiting`` note when the wait begins or what it waits on changes, not at every look.
    """
    retry_in = max(0.0, retry_in)
    with transaction.atomic():
        updated = Record.objects.filter(
            pk=record_id, phase__in=_CONVERGIBLE, deletion_requested_at__isnull=True
        ).update(next_attempt_at=timezone.now() + timedelta(seconds=retry_in) + _lease(), held_by=None)
        if updated:
            if waiting is not None and not _waiting_told(record_id, waiting):
                record_event_write(record_id, EventType.NOTE, reason="Waiting", message=waiting)
            _enqueue_converge_on_commit(record_id, countdown=retry_in)


def _waiting_told(record_id: Any, message: str) -> bool:
    """Whether the record's latest event already says it waits on this."""
    last = Event.objects.filter(record_id=record_id).order_by("-id").values_list("type", "reason", "message").first()
    return last == (EventType.NOTE, "Waiting", message)


@transaction.atomic
def _converge_failed(*, record_id: Any, error: BaseException) -> None:
    record = Record.objects.select_for_update(no_key=True).filter(pk=record_id).first()
    if record is None or record.phase not in _CONVERGIBLE or record.deletion_requested_at is not None:
        return
    attempts = record.attempts + 1
    message = _error_text(error)
    permanent = isinstance(error, PermanentError | UnknownKind)
    now = timezone.now()
    if permanent or attempts >= settings.GRAPHENE_CREATE_ATTEMPTS:
        Event.objects.create(
            **_event_kwargs(
                record.pk, EventType.ERROR, reason="CreateFailed", message=message, data={"attempt": attempts}
            )
        )
        _transition(
            [record],
            Phase.CREATE_FAILED,
            reason="PermanentError" if permanent else "RetriesExhausted",
            message=message,
            fields={"attempts": attempts, "last_error": message, "next_attempt_at": None, "held_by": None},
        )
        return
    delay = backoff_seconds(attempts)
    Event.objects.create(
        **_event_kwargs(
            record.pk,
            EventType.ERROR,
            reason="CreateFailed",
            message=message,
            data={"attempt": attempts, "retry_in_s": round(delay, 3)},
        )
    )
    Record.objects.filter(pk=record.pk).update(
        attempts=attempts,
        last_error=message,
        next_attempt_at=now + timedelta(seconds=delay) + _lease(),
        held_by=None,
        updated_at=now,
    )
    _enqueue_converge_on_commit(record.pk, countdown=delay)
