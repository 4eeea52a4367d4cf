"""Worker heartbeats: each worker process proves it is alive, and any other worker notices
within seconds when one is not, so that what it held is taken over without waiting for a
long fixed lease.

* ``heartbeat_start()`` (called from Celery's worker signals, graphene_project/celery.py) gives
  the process an identity (a ``WorkerHeartbeat`` row: a uuid, its host name and pid) and starts
  a thread that refreshes the row every ``GRAPHENE_WORKER_HEARTBEAT_SECONDS`` over a database
  session of its own. The thread is independent of the tasks: a kind's call that takes minutes
  does not stop it, so a slow but alive worker keeps what it holds.
* ``current_worker_id()``: the identity that the services write into what they hold (a record's
  ``held_by``, a run's lease through ``lease_hold``); ``None`` outside a worker process (the web
  process, a test calling a service, embedded mode), where only the long fixed leases apply.
* ``workers_sweep()`` runs after each beat, in every worker: a worker is *lost* when its
  heartbeat's database session has ended (PostgreSQL closes a dead process's connection at once;
  a server restart since that session began does not count) and it has not beaten for two
  periods, or when it has not beaten for ``GRAPHENE_WORKER_LOST_SECONDS`` (a hung process).
  The first sweeper to lock its row marks it lost and emits ``domain.WorkerLost``; the apps
  that hold work for workers take it over (``apps.records``: operations, ``apps.pipelines``:
  run leases). Rows of workers lost (or stopped) long ago are purged with their leases.

PostgreSQL only: embedded mode (SQLite) is one process, whose death ends everything at once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.core import domain
from apps.core.db import is_postgresql
from apps.core.models import HeldLease, WorkerHeartbeat

logger = logging.getLogger(__name__)

# Lost workers' rows (and the leases they held) are kept this long for the record, then purged.
LOST_RETENTION = timedelta(hours=1)
# Sweeps between two purges of old rows.
PURGE_EVERY = 60


class _Heartbeat(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="graphene-worker-heartbeat", daemon=True)
        self.pid = os.getpid()
        self.worker_id: uuid.UUID | None = None
        self.stopped = threading.Event()
        self.registered = threading.Event()
        self.session: tuple[int | None, datetime | None] | None = None
        self.session_of: Any = None  # the connection ``session`` describes

    def run(self) -> None:
        period = settings.GRAPHENE_WORKER_HEARTBEAT_SECONDS
        beats = 0
        try:
            while True:
                try:
                    self._beat()
                    self.registered.set()
                    workers_sweep(me=self.worker_id, purge=beats % PURGE_EVERY == 0)
                except Exception:
                    # The database is away (a restart): beat again next period, on a new session.
                    logger.warning("worker heartbeat failed; retrying", exc_info=True)
                    connection.close()
                beats += 1
                if self.stopped.wait(period):
                    return
        finally:
            connection.close()

    def _beat(self) -> None:
        now = timezone.now()
        connection.ensure_connection()
        if self.session is None or self.session_of is not connection.connection:
            self.session, self.session_of = _session(), connection.connection  # a new database session
        session_pid, session_started_at = self.session
        if self.worker_id is not None:
            beaten = WorkerHeartbeat.objects.filter(pk=self.worker_id, lost_at__isnull=True).update(
                beat_at=now, session_pid=session_pid, session_started_at=session_started_at
            )
            if beaten:
                return
            # Marked lost (this process stalled past the limit: what it held was taken over) or
            # the row is gone: carry on under a new identity.
            logger.warning("worker %s was marked lost or removed; registering anew", self.worker_id)
        worker_id = uuid.uuid4()
        WorkerHeartbeat.objects.create(
            id=worker_id,
            hostname=socket.gethostname()[:255],
            pid=self.pid,
            started_at=now,
            beat_at=now,
            session_pid=session_pid,
            session_started_at=session_started_at,
        )
        self.worker_id = worker_id

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=5)
        if self.worker_id is not None:
            try:
                WorkerHeartbeat.objects.filter(pk=self.worker_id).delete()
                HeldLease.objects.filter(worker_id=self.worker_id).delete()
            finally:
                connection.close()


_heartbeat: _Heartbeat | None = None
_guard = threading.Lock()


def heartbeat_start() -> None:
    """Give this worker process its identity and start its heartbeat (once per process;
    a forked child starts its own). Waits for the first beat, so that the first task already
    runs under the identity. Nothing on SQLite (embedded mode)."""
    global _heartbeat
    if not is_postgresql():
        return
    with _guard:
        if _heartbeat is not None and _heartbeat.pid == os.getpid():
            return
        _heartbeat = _Heartbeat()
        _heartbeat.start()
    _heartbeat.registered.wait(timeout=2)  # bounded: a pool child must report alive within seconds


def heartbeat_stop() -> None:
    """The process is shutting down cleanly (its tasks are done): remove its row."""
    global _heartbeat
    with _guard:
        beat, _heartbeat = _heartbeat, None
    if beat is not None and beat.pid == os.getpid():
        beat.stop()


def current_worker_id() -> uuid.UUID | None:
    """This process's worker identity, or ``None`` when it has no heartbeat."""
    beat = _heartbeat
    if beat is None or beat.pid != os.getpid():
        return None
    return beat.worker_id


def _session() -> tuple[int | None, datetime | None]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        row = cursor.fetchone()
    return (row[0], row[1]) if row else (None, None)


def _live_sessions(pids: list[int]) -> tuple[set[tuple[int, datetime]], datetime]:
    """The sessions among ``pids`` that are still open, and when the server last started."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, backend_start FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
        # A session of another role may show no backend_start (no pg_read_all_stats): such a
        # pid counts as open, whatever session it is (the time rule still applies).
        live = {(pid, started) for pid, started in cursor.fetchall()}
        cursor.execute("SELECT pg_postmaster_start_time()")
        server_started = cursor.fetchone()[0]
    return live, server_started


def _lost_reason(worker: WorkerHeartbeat, now: datetime, live: set[Any], server_started: datetime) -> str:
    silent = (now - worker.beat_at).total_seconds()
    if silent >= settings.GRAPHENE_WORKER_LOST_SECONDS:
        return f"no heartbeat for {silent:.1f} s"
    if (
        worker.session_pid is not None
        and worker.session_started_at is not None
        and worker.session_started_at > server_started
        and (worker.session_pid, worker.session_started_at) not in live
        and (worker.session_pid, None) not in live
    ):
        return f"its database session ended (the process died); last heartbeat {silent:.1f} s ago"
    return ""


def workers_sweep(*, me: uuid.UUID | None = None, now: datetime | None = None, purge: bool = False) -> list[str]:
    """Mark lost the workers that are (see the module's docstring) and emit ``WorkerLost`` for
    each; returns their ids. Run by every worker after its beat; cheap when all are alive."""
    now = now or timezone.now()
    period = settings.GRAPHENE_WORKER_HEARTBEAT_SECONDS
    candidates = WorkerHeartbeat.objects.filter(lost_at__isnull=True, beat_at__lt=now - timedelta(seconds=2 * period))
    silent = list(candidates if me is None else candidates.exclude(pk=me))
    lost: list[str] = []
    if silent:
        live, server_started = _live_sessions([w.session_pid for w in silent if w.session_pid is not None])
        for candidate in silent:
            reason = _lost_reason(candidate, now, live, server_started)
            if not reason:
                continue
            with transaction.atomic():
                worker = (
                    WorkerHeartbeat.objects.select_for_update(skip_locked=True)
                    .filter(pk=candidate.pk, lost_at__isnull=True, beat_at=candidate.beat_at)
                    .first()
                )
                if worker is None:
                    continue  # another worker is marking it, or it beat meanwhile
                WorkerHeartbeat.objects.filter(pk=worker.pk).update(lost_at=now, lost_reason=reason[:200])
                logger.warning("worker %s (%s) lost: %s", worker, worker.pk, reason)
                domain.emit(
                    domain.WorkerLost(
                        worker_id=str(worker.pk),
                        hostname=worker.hostname,
                        pid=worker.pid,
                        beat_at=worker.beat_at,
                        reason=reason,
                    )
                )
                lost.append(str(worker.pk))
    if purge:
        workers_purge(now=now)
    return lost


def workers_purge(*, now: datetime | None = None) -> int:
    """Remove the rows of workers lost more than ``LOST_RETENTION`` ago, with their leases."""
    cutoff = (now or timezone.now()) - LOST_RETENTION
    gone = list(WorkerHeartbeat.objects.filter(lost_at__lt=cutoff).values_list("pk", flat=True)[:500])
    if gone:
        HeldLease.objects.filter(worker_id__in=gone).delete()
        WorkerHeartbeat.objects.filter(pk__in=gone).delete()
    return len(gone)


def worker_describe(worker_id: Any) -> dict[str, Any]:
    """What an event says of a worker: its id, host name and pid (as far as its row is kept)."""
    row = WorkerHeartbeat.objects.filter(pk=worker_id).values("hostname", "pid").first()
    return {"worker": str(worker_id), **(row or {})}


def worker_text(worker: dict[str, Any]) -> str:
    """``host (pid 123)``, or the bare id of a worker whose row is gone."""
    if "hostname" in worker:
        return f"{worker['hostname']} (pid {worker['pid']})"
    return str(worker["worker"])


# --- leases held by workers -------------------------------------------------------------------


def lease_hold(*, token: uuid.UUID, subject: str) -> None:
    """Note that this worker holds the lease ``token`` (in the caller's transaction). Nothing
    outside a worker: such a lease is only ever taken over when it expires."""
    worker_id = current_worker_id()
    if worker_id is not None:
        HeldLease.objects.create(token=token, worker_id=worker_id, subject=subject[:80], taken_at=timezone.now())


def lease_release(*, token: uuid.UUID) -> None:
    """The lease ``token`` is let go (its execution ended, however)."""
    if current_worker_id() is not None:
        HeldLease.objects.filter(token=token).delete()


def leases_of(worker_id: Any) -> list[uuid.UUID]:
    """The lease tokens a worker held."""
    return list(HeldLease.objects.filter(worker_id=worker_id).values_list("token", flat=True))


def lease_lost_holder(token: Any) -> dict[str, Any] | None:
    """The lost worker that held the lease ``token`` (see ``worker_describe``), or ``None``."""
    row = HeldLease.objects.filter(token=token).values_list("worker_id", flat=True).first()
    if row is None or not WorkerHeartbeat.objects.filter(pk=row, lost_at__isnull=False).exists():
        return None
    return worker_describe(row)
