"""Worker heartbeats (apps/core/workers.py): which workers count as lost, what is taken over
from them, and that the reconciler leaves alone an operation whose worker still beats."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from apps.core import workers
from apps.core.models import WorkerHeartbeat
from apps.records import services
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from tests import factories
from tests.harness.processes import purge_queue
from tests.harness.wait import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# Every worker process sweeps after each beat, the session's shared workers too: a test asks
# for the outcome of a sweep (the row marked, the note written), not for who made it.


@pytest.fixture(autouse=True)
def _no_messages_left() -> Iterator[None]:
    yield
    purge_queue()  # the takeovers' messages: no worker of this test consumes them


def heartbeat(*, silent_s: float, session: tuple[int, datetime] | None) -> WorkerHeartbeat:
    now = timezone.now()
    pid, started = session if session is not None else (None, None)
    return WorkerHeartbeat.objects.create(
        id=uuid.uuid4(),
        hostname="box",
        pid=4242,
        started_at=now - timedelta(minutes=1),
        beat_at=now - timedelta(seconds=silent_s),
        session_pid=pid,
        session_started_at=started,
    )


def this_session() -> tuple[int, datetime]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        pid, started = cursor.fetchone()
    return pid, started


def ended_session() -> tuple[int, datetime]:
    """A session that began after the server started and is gone: no such pid is open."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(max(pid), 0) + 100000 FROM pg_stat_activity")
        (pid,) = cursor.fetchone()
    return pid, timezone.now() - timedelta(seconds=30)


def held(worker: WorkerHeartbeat, phase: str = Phase.CREATING) -> Record:
    record = factories.sleep(factories.run(), "held")
    Record.objects.filter(pk=record.pk).update(phase=phase, held_by=worker.pk)
    return record


def test_a_worker_whose_session_ended_is_lost_and_its_convergence_is_taken_over() -> None:
    record = factories.sleep(factories.run(), "held")
    # The lost worker and the operation it holds commit together: a shared worker's sweep
    # (after each of its beats) finds both or neither, never the worker without its operation.
    with transaction.atomic():
        dead = heartbeat(silent_s=3, session=ended_session())
        Record.objects.filter(pk=record.pk).update(phase=Phase.CREATING, held_by=dead.pk)

    workers.workers_sweep()

    dead.refresh_from_db()
    assert dead.lost_at is not None
    assert "database session ended" in dead.lost_reason
    note = wait_for(
        lambda: Event.objects.filter(record=record, type=EventType.NOTE, reason="WorkerLost").first(),
        timeout=10,
        what="the takeover's note",
    )
    assert note is not None
    assert note.data["worker"] == str(dead.pk)
    assert "box (pid 4242)" in note.message
    record.refresh_from_db()
    assert record.held_by == dead.pk, "kept until another worker takes it (and says Resumed)"
    assert workers.workers_sweep() == [], "lost once"


def test_a_silent_worker_whose_session_is_open_is_lost_only_after_the_limit() -> None:
    connected = heartbeat(silent_s=3, session=this_session())
    assert workers.workers_sweep() == []
    WorkerHeartbeat.objects.filter(pk=connected.pk).update(beat_at=timezone.now() - timedelta(seconds=11))
    workers.workers_sweep()
    connected.refresh_from_db()
    assert connected.lost_at is not None
    assert connected.lost_reason.startswith("no heartbeat for")


def test_a_worker_that_beat_recently_is_never_lost_whatever_its_session() -> None:
    heartbeat(silent_s=0.5, session=ended_session())
    assert workers.workers_sweep() == []


def test_the_reconciler_renews_an_operation_whose_worker_beats_and_retries_a_lost_ones() -> None:
    alive = heartbeat(silent_s=0, session=this_session())
    slow = held(alive)
    Record.objects.filter(pk=slow.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=1))

    assert services.records_reconcile() == 0, "a slow create on a live worker is not enqueued again"
    slow.refresh_from_db()
    assert slow.next_attempt_at is not None
    assert slow.next_attempt_at > timezone.now()

    WorkerHeartbeat.objects.filter(pk=alive.pk).update(lost_at=timezone.now())
    Record.objects.filter(pk=slow.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    assert services.records_reconcile() == 1
