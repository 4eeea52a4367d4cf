"""The beat's safety net for runs: deadlines, expired leases, due timers, lost messages and
lost wake-ups. A lost message delays a run; it never loses it. And the runs of a lost worker
taken over at once (``runs_take_over``), before their leases expire."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.core import domain, workers
from apps.pipelines.choices import ACTIVE, RunStatus
from apps.pipelines.models import Run, RunWait
from apps.pipelines.services.lifecycle import run_finish, runs_wake, targets_settled
from apps.pipelines.services.transitions import run_enqueue_on_commit, run_lock, run_transition

_REASONS = {"lease_expired": "LeaseExpired", "timer_due": "TimerDue", "requeued": "Requeued"}


def runs_recover(*, now: datetime | None = None, limit: int = 200) -> dict[str, int]:
    """Expired leases, due timers, lost messages and wake-ups, deadlines: one pass."""
    now = now or timezone.now()
    counts = {"lease_expired": 0, "timer_due": 0, "requeued": 0, "timed_out": 0, "rewoken": 0}
    for run in Run.objects.filter(deadline_at__lte=now, status__in=list(ACTIVE)).order_by("deadline_at")[:limit]:
        if run_finish(run=run, status=RunStatus.TIMED_OUT, error=f"run exceeded its deadline at {run.deadline_at}"):
            counts["timed_out"] += 1
    stale = timedelta(seconds=settings.GRAPHENE_RUN_LEASE_SECONDS)
    # A wake-up lost between a commit and its notification: look again at runs that have
    # waited a while (oldest first, touched so that the scan rotates).
    waiting = list(
        Run.objects.filter(status=RunStatus.SUSPENDED, wake_at__isnull=True, updated_at__lt=now - stale)
        .order_by("updated_at")
        .values_list("pk", flat=True)[:limit]
    )
    if waiting:
        targets = RunWait.objects.filter(run_id__in=waiting).values_list("target", flat=True)
        counts["rewoken"] = runs_wake(targets=targets_settled(targets))
        Run.objects.filter(pk__in=waiting, status=RunStatus.SUSPENDED).update(updated_at=now)
    expired = Run.objects.filter(status=RunStatus.RUNNING, lease_expires_at__lt=now).values_list("pk", flat=True)
    due = Run.objects.filter(status=RunStatus.SUSPENDED, wake_at__lte=now).values_list("pk", flat=True)
    lost = Run.objects.filter(status=RunStatus.QUEUED, updated_at__lt=now - stale).values_list("pk", flat=True)
    for key, ids in (("lease_expired", expired[:limit]), ("timer_due", due[:limit]), ("requeued", lost[:limit])):
        for run_id in ids:
            with transaction.atomic():
                run = run_lock(run_id)
                if key == "lease_expired" and not (
                    run.status == RunStatus.RUNNING and run.lease_expires_at and run.lease_expires_at < now
                ):
                    continue
                if key == "timer_due" and not (
                    run.status == RunStatus.SUSPENDED and run.wake_at and run.wake_at <= now
                ):
                    continue
                if key == "requeued" and run.status != RunStatus.QUEUED:
                    continue
                RunWait.objects.filter(run=run).delete()
                run_transition(
                    run=run,
                    to=RunStatus.QUEUED,
                    reason=_REASONS[key],
                    fields={"lease_token": None, "lease_expires_at": None, "waiting_on": [], "wake_at": None},
                )
                run_enqueue_on_commit(run.pk)
                counts[key] += 1
    return counts


def runs_take_over(*, worker_id: str, worker: str, reason: str) -> int:
    """The worker ``worker_id`` is lost: the runs it was executing are queued again at once
    (event ``WorkerLost``; the next execution's event is ``Resumed``). Returns how many."""
    tokens = workers.leases_of(worker_id)
    taken = 0
    for run_id in Run.objects.filter(status=RunStatus.RUNNING, lease_token__in=tokens).values_list("pk", flat=True):
        with transaction.atomic():
            run = run_lock(run_id)
            if run.status != RunStatus.RUNNING or run.lease_token not in tokens:
                continue
            RunWait.objects.filter(run=run).delete()
            run_transition(
                run=run,
                to=RunStatus.QUEUED,
                reason="WorkerLost",
                message=f"worker {worker} was lost while executing it ({reason}); it resumes elsewhere",
                data={"worker": worker_id, "reason": reason},
                fields={"lease_token": None, "lease_expires_at": None, "waiting_on": [], "wake_at": None},
            )
            run_enqueue_on_commit(run.pk)
            taken += 1
    return taken


def runs_take_over_on_worker_lost(event: domain.WorkerLost) -> None:
    """Subscriber: a worker was lost; the runs it was executing resume elsewhere."""
    runs_take_over(worker_id=event.worker_id, worker=f"{event.hostname} (pid {event.pid})", reason=event.reason)
