"""Drift: ready records observed on their interval, differences healed or reported."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.core import domain
from apps.records.choices import DriftPolicy, EventType, Phase
from apps.records.models import Event, Record
from apps.records.services.transitions import (
    _enqueue_converge_on_commit,
    _error_text,
    _event_kwargs,
    _lease,
    _transition,
)
from kinds import Drift, NotYet, Observed, get_kind, registry

# Shortly after a change (created, updated, healed, drift resolved) a record is observed
# sooner: after this fraction of its interval, at least OBSERVE_SOON_MIN.
OBSERVE_SOON_FRACTION = 0.1

OBSERVE_SOON_MIN = timedelta(seconds=2)

_OBSERVABLE = frozenset({Phase.READY, Phase.DRIFTED})


def observe_interval(record: Record) -> timedelta | None:
    """How often ``record`` is observed: its ``observe_every``, else its kind's interval."""
    kind = registry().get(record.kind)
    if kind is None or kind.drift_interval is None:
        return None
    if record.observe_every:
        return timedelta(seconds=record.observe_every)
    return kind.drift_interval


def _next_observe(record: Record, now: datetime, *, soon: bool = False) -> datetime | None:
    interval = observe_interval(record)
    if interval is None:
        return None
    if soon:
        return now + min(interval, max(interval * OBSERVE_SOON_FRACTION, OBSERVE_SOON_MIN))
    return now + interval


def records_observe_due(*, now: datetime | None = None, limit: int | None = None) -> int:
    """Beat: claim the records due for observation (through the partial index, oldest first)
    and enqueue them in batches. A claim pushes ``next_observe_at`` one lease ahead, so a lost
    batch is picked up again after the lease; the batch sets the real next time."""
    from apps.records.tasks import records_observe_task

    now = now or timezone.now()
    limit = limit or settings.GRAPHENE_OBSERVE_SCAN_LIMIT
    with transaction.atomic():
        due = list(
            Record.objects.select_for_update(skip_locked=True, no_key=True)
            .filter(next_observe_at__lte=now)
            .order_by("next_observe_at")
            .values_list("pk", flat=True)[:limit]
        )
        if not due:
            return 0
        Record.objects.filter(pk__in=due).update(next_observe_at=now + _lease())
        size = max(1, settings.GRAPHENE_OBSERVE_BATCH)
        batches = [[str(pk) for pk in due[i : i + size]] for i in range(0, len(due), size)]
        transaction.on_commit(lambda: [records_observe_task.delay(batch) for batch in batches])
    return len(due)


def records_observe(*, record_ids: Sequence[Any]) -> dict[str, int]:
    """Observe a batch: each kind's ``observe`` and ``diff``, outside any transaction; records
    found as specified get their next observation in one UPDATE per interval; drift is handled
    per record under its lock. Returns counts (clean, drifted, healing, resolved, skipped, failed)."""
    counts = dict.fromkeys(("clean", "drifted", "healing", "resolved", "skipped", "failed"), 0)
    now = timezone.now()
    clean: defaultdict[timedelta, list[Any]] = defaultdict(list)
    later: defaultdict[timedelta, list[Any]] = defaultdict(list)
    skipped: list[Any] = []
    changed: list[tuple[Record, list[Drift] | None]] = []
    for record in Record.objects.filter(pk__in=list(record_ids)):
        interval = observe_interval(record)
        if interval is None or record.phase not in _OBSERVABLE or record.deletion_requested_at is not None:
            skipped.append(record.pk)
            continue
        kind = get_kind(record.kind)
        try:
            observed: Observed | None = kind.observe(record)
            drifts = kind.diff(record, observed) if observed is not None else None
        except NotYet:  # cannot look now (its agent is away): look again next interval, quietly
            later[interval].append(record.pk)
            continue
        except Exception as exc:  # the kind could not look (engine down, network): try again later
            counts["failed"] += 1
            _observe_failed(record, exc, now + interval)
            continue
        if drifts == [] and record.phase == Phase.READY:
            clean[interval].append(record.pk)
        else:
            changed.append((record, drifts))
    for interval, ids in clean.items():
        counts["clean"] += Record.objects.filter(
            pk__in=ids, phase=Phase.READY, deletion_requested_at__isnull=True
        ).update(next_observe_at=now + interval, observed_at=now)
    for interval, ids in later.items():
        counts["skipped"] += Record.objects.filter(pk__in=ids, next_observe_at__isnull=False).update(
            next_observe_at=now + interval
        )
    if skipped:
        counts["skipped"] += Record.objects.filter(pk__in=skipped).update(next_observe_at=None)
    for record, drifts in changed:
        counts[_drift_handle(record.pk, drifts, now)] += 1
    return counts


@transaction.atomic
def _drift_handle(record_id: Any, drifts: list[Drift] | None, now: datetime) -> str:
    """Act on one observation that did not match (``drifts``; None: the object is gone), or a
    drifted record that matches again (``[]``), under the record's lock."""
    record = Record.objects.select_for_update(no_key=True).filter(pk=record_id).first()
    if record is None or record.phase not in _OBSERVABLE or record.deletion_requested_at is not None:
        return "skipped"  # it changed meanwhile (deleted, updating): its new phase decides
    if drifts == []:
        if record.phase == Phase.READY:
            return "skipped"
        _transition(
            [record],
            Phase.READY,
            reason="DriftResolved",
            fields={"observed_at": now, "next_observe_at": _next_observe(record, now, soon=True)},
        )
        return "resolved"
    gone = drifts is None
    changes = [{"field": d.field, "desired": d.desired, "actual": d.actual} for d in drifts or []]
    if record.phase == Phase.DRIFTED and record.drift_policy == DriftPolicy.REPORT:
        # Reported already: keep watching (it may come back), without an event per look.
        Record.objects.filter(pk=record.pk).update(observed_at=now, next_observe_at=_next_observe(record, now))
        return "drifted"
    what = "is gone" if gone else "differs from its spec in " + ", ".join(c["field"] for c in changes)
    Event.objects.create(
        **_event_kwargs(
            record.pk,
            EventType.DRIFT_DETECTED,
            reason="Gone" if gone else "Drifted",
            message=f"{record} {what}",
            data={"gone": gone, "changes": changes, "policy": record.drift_policy},
            at=now,
        )
    )
    domain.emit(domain.RecordDrifted(record=record.ref(), gone=gone))
    if record.drift_policy == DriftPolicy.HEAL:
        _transition(
            [record],
            Phase.CREATING if gone else Phase.UPDATING,
            reason="Healing",
            message=f"{record} {what}: re-converging",
            fields={
                "healing": True,
                "observed_at": now,
                "next_observe_at": None,
                "attempts": 0,
                "next_attempt_at": now + _lease(),
            },
        )
        _enqueue_converge_on_commit(record.pk)
        return "healing"
    _transition(
        [record],
        Phase.DRIFTED,
        reason="Gone" if gone else "Drifted",
        message=f"{record} {what}",
        fields={"observed_at": now, "next_observe_at": _next_observe(record, now)},
    )
    return "drifted"


def _observe_failed(record: Record, error: BaseException, retry_at: datetime) -> None:
    message = _error_text(error)
    with transaction.atomic():
        Event.objects.create(
            **_event_kwargs(record.pk, EventType.ERROR, reason="ObserveFailed", message=message, data={})
        )
        Record.objects.filter(pk=record.pk, next_observe_at__isnull=False).update(next_observe_at=retry_at)
