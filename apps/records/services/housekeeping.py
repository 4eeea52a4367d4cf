"""The beat's housekeeping: work whose lease ran out re-enqueued, tombstones purged, orphans
swept; and the operations of a lost worker taken over (``records_take_over``)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from apps.core import domain
from apps.core.models import WorkerHeartbeat
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from apps.records.services.declare import record_ensure_root
from apps.records.services.transitions import (
    _CONVERGIBLE,
    _enqueue_converge_on_commit,
    _error_text,
    _event_kwargs,
    _held,
    _is_uuid,
    _lease,
    _live_children,
    _lock_tree,
    _notify,
)


def _holder_alive() -> Exists:
    """Whether the worker running the record's operation still proves itself alive."""
    return Exists(WorkerHeartbeat.objects.filter(pk=OuterRef("held_by"), lost_at__isnull=True))


def records_reconcile(*, now: datetime | None = None, limit: int = 500) -> int:
    """Re-enqueue work whose lease ran out (a lost message or a dead worker): never lost, only late.

    An operation whose worker still beats is not due however long it takes (a slow create):
    its lease is renewed instead. A lost worker's operations are taken over before their lease
    runs out (``records_take_over``); this is the net for holders without a heartbeat."""
    from apps.records.tasks import records_delete_task

    now = now or timezone.now()
    with transaction.atomic():
        due = list(
            Record.objects.select_for_update(skip_locked=True, no_key=True)
            .filter(next_attempt_at__lte=now)
            .annotate(has_live_children=_live_children(), is_held=_held(), holder_alive=_holder_alive())
            .order_by("next_attempt_at")[:limit]
        )
        if not due:
            return 0
        running = [r for r in due if r.holder_alive]
        if running:
            Record.objects.filter(pk__in=[r.pk for r in running]).update(next_attempt_at=now + _lease())
            due = [r for r in due if not r.holder_alive]
        # Back off per record: a record that has waited long is more likely behind a long
        # queue than lost, and re-sending it every lease would only grow that queue.
        cap = max(_lease(), timedelta(seconds=60))
        for record in due:
            waited = max(now - record.updated_at, timedelta(0))
            record.next_attempt_at = now + min(max(_lease(), waited), cap)
        Record.objects.bulk_update(due, ["next_attempt_at"])
        converge, delete, idle = [], [], []
        for record in due:
            if record.phase == Phase.DELETED:
                idle.append(record.pk)
            elif record.deletion_requested_at is not None:
                if record.is_held and record.phase not in (Phase.DELETING, Phase.DELETE_FAILED):
                    idle.append(record.pk)  # a protected record holds it: nothing to do until unprotected
                elif not record.has_live_children:
                    delete.append(str(record.pk))
            elif record.phase in _CONVERGIBLE:
                converge.append(record.pk)
            else:
                idle.append(record.pk)
        Record.objects.filter(pk__in=idle).update(next_attempt_at=None)
        for pk in converge:
            _enqueue_converge_on_commit(pk)
        if delete:
            transaction.on_commit(lambda: [records_delete_task.delay([pk]) for pk in delete])
    return len(converge) + len(delete)


def records_purge(*, now: datetime | None = None, limit: int = 100) -> int:
    """Remove tombstones older than the retention, whole deleted subtrees at a time."""
    cutoff = (now or timezone.now()) - settings.GRAPHENE_TOMBSTONE_RETENTION
    tops = list(
        Record.objects.filter(deleted_at__lt=cutoff)
        .filter(Q(parent__isnull=True) | ~Q(parent__phase=Phase.DELETED))
        .order_by("deleted_at")[:limit]
    )
    purged = 0
    for top in tops:
        with transaction.atomic():
            _lock_tree(top.tree_id)
            fresh = Record.objects.filter(pk=top.pk).first()
            if fresh is None:
                continue
            subtree = Record.objects.filter(tree_id=fresh.tree_id, lft__gte=fresh.lft, rght__lte=fresh.rght)
            if subtree.exclude(phase=Phase.DELETED).exists():
                continue  # a live descendant (cannot happen children-first, but never drop it)
            purged += subtree.count()
            fresh.delete()  # mptt closes the gap; events go with the rows
    return purged


SWEEPER_NAME = "sweeper"


def records_sweep(*, dry_run: bool = False) -> list[dict[str, Any]]:
    """Find external objects carrying a marker whose record is deleted or unknown; delete them.

    Each finding is reported as an event on the ``graphene.sweeper`` root record.
    """
    from kinds import registry

    sweeper = record_ensure_root(kind="graphene.sweeper", name=SWEEPER_NAME)
    findings: list[dict[str, Any]] = []
    for kind_name, kind in sorted(registry().items()):
        marked = list(kind.sweep())
        ids = {m.record_id for m in marked}
        valid = {i for i in ids if _is_uuid(i)}
        live = set(
            str(pk)
            for pk in Record.objects.filter(pk__in=valid).exclude(phase=Phase.DELETED).values_list("pk", flat=True)
        )
        for item in marked:
            if item.record_id in live:
                continue
            known = _is_uuid(item.record_id) and Record.objects.filter(pk=item.record_id).exists()
            finding = {
                "kind": kind_name,
                "external_id": item.external_id,
                "record_id": item.record_id,
                "record": "deleted" if known else "unknown",
            }
            if dry_run:
                findings.append({**finding, "action": "none (dry run)"})
                continue
            try:
                kind.delete_external(item.external_id)
            except Exception as exc:
                finding["error"] = _error_text(exc)
                Event.objects.create(
                    **_event_kwargs(
                        sweeper.pk,
                        EventType.ORPHAN_DELETE_FAILED,
                        reason="Orphan",
                        message=finding["error"],
                        data=finding,
                    )
                )
            else:
                Event.objects.create(
                    **_event_kwargs(
                        sweeper.pk,
                        EventType.ORPHAN_DELETED,
                        reason="Orphan",
                        message=f"deleted {kind_name} object {item.external_id} (record {finding['record']})",
                        data=finding,
                    )
                )
            findings.append(finding)
    return findings


def records_take_over(*, worker_id: str, worker: str, reason: str) -> int:
    """The worker ``worker_id`` is lost: its operations go on elsewhere now, each with a
    ``WorkerLost`` event. The record keeps ``held_by`` until another worker takes it, which
    then tells ``Resumed``; the operation lock (released with the dead worker's connection)
    keeps the two from overlapping. Returns the operations re-enqueued."""
    from apps.records.tasks import records_delete_task

    now = timezone.now()
    with transaction.atomic():
        held = list(
            Record.objects.select_for_update(no_key=True)
            .filter(held_by=worker_id)
            .exclude(phase=Phase.DELETED)
            .annotate(has_live_children=_live_children())
            .order_by("pk")
        )
        converge, delete = [], []
        for record in held:
            if record.deletion_requested_at is not None:
                if record.phase not in (Phase.DELETING, Phase.DELETE_FAILED) and record.has_live_children:
                    continue  # its deletion follows its children's, which go on by themselves
                delete.append(str(record.pk))
                what = "deletion"
            elif record.phase in _CONVERGIBLE:
                converge.append(record.pk)
                what = "convergence"
            else:
                continue
            Event.objects.create(
                **_event_kwargs(
                    record.pk,
                    EventType.NOTE,
                    reason="WorkerLost",
                    message=f"worker {worker} was lost during the {what} ({reason}); it goes on elsewhere",
                    data={"worker": worker_id, "reason": reason},
                    at=now,
                )
            )
        if held:
            # The lease stays as the net, from now: should this message be lost too.
            Record.objects.filter(pk__in=[r.pk for r in held]).update(next_attempt_at=now + _lease())
        for pk in converge:
            _enqueue_converge_on_commit(pk)
        if delete:
            transaction.on_commit(lambda: [records_delete_task.delay([pk]) for pk in delete])
        _notify(held)
    return len(converge) + len(delete)


def records_take_over_on_worker_lost(event: domain.WorkerLost) -> None:
    """Subscriber: a worker was lost; the operations it held go on elsewhere."""
    records_take_over(worker_id=event.worker_id, worker=f"{event.hostname} (pid {event.pid})", reason=event.reason)
