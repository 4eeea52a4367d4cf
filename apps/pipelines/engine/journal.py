"""The run's journal as one execution sees it, and the fence around everything it writes.

Each SDK call takes the next sequence number (``Journal.next``). If the journal has an entry
there, the call must be the same (else ``NonDeterminismError``) and returns the recorded
result; otherwise it acts and journals. Journal writes are *fenced*: they succeed only while
this execution holds the run's lease and the run is still running, so a worker that lost
its lease (it was too slow, or the run was cancelled) cannot write anything more and stops at
its next call (``_Fenced``).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from django.db import connection, transaction
from django.utils import timezone
from graphene_sdk import NonDeterminismError, ResourceFailed
from pydantic import BaseModel

from apps.core.db import is_postgresql
from apps.core.errors import GrapheneError as ServiceError
from apps.pipelines.choices import EntryStatus, RunStatus
from apps.pipelines.models import JournalEntry, Run

T = TypeVar("T")


class _Suspend(BaseException):
    """Unwinds the pipeline function to release the worker (not catchable as Exception).

    By default the run resumes when a target in ``waiting_on`` settles. ``until`` replaces
    that test for waits on something more specific than "settled" (an agent record that gave
    up creating stays settled until its agent connects): the run is still woken by the
    targets' transitions, and goes again at once only if ``until()`` already holds.
    """

    def __init__(
        self,
        *,
        waiting_on: list[str] | None = None,
        wake_at: datetime | None = None,
        until: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__("suspend")
        self.waiting_on = waiting_on or []
        self.wake_at = wake_at
        self.until = until


class _Fenced(BaseException):
    """This worker may no longer act for the run (lease lost, run cancelled or ended)."""


def result_of(entry: JournalEntry) -> dict[str, Any]:
    result: dict[str, Any] = entry.result or {}
    return result


def is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def to_json(value: Any) -> Any:
    """The JSON form replay will return; the first execution returns the same.

    A NUL character is refused here, with the reason: PostgreSQL cannot store it in JSON, and
    a value that cannot be journaled would otherwise keep the run from ever ending.
    """
    value = value.model_dump(mode="json") if isinstance(value, BaseModel) else json.loads(json.dumps(value))
    where = _nul_at(value, "")
    if where is not None:
        raise ValueError(
            f"the value{f' at {where}' if where else ''} contains a NUL character (\\x00), which cannot be "
            "stored; remove it or encode the data (e.g. base64)"
        )
    return value


def _nul_at(value: Any, path: str) -> str | None:
    """The path of the first string (or key) holding a NUL character in a JSON value."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            if "\x00" in key:
                return f"{path}.{key!r}".lstrip(".")
            found = _nul_at(item, f"{path}.{key}".lstrip("."))
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _nul_at(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


class Journal:
    """The entries of one run, the sequence number of the current call, and the fence."""

    def __init__(self, run: Run, token: uuid.UUID) -> None:
        self.run = run
        self.token = token
        # Only an execution holding the run's lease writes its journal: on the first attempt
        # (the run's first lease) there is nothing to read.
        self.entries = {e.seq: e for e in JournalEntry.objects.filter(run=run)} if run.attempt > 1 else {}
        self.seq = 0
        self.divergence: NonDeterminismError | None = None
        # Set once this execution learns it lost the run (the heartbeat, a fenced write).
        self.lost = threading.Event()

    def leftover(self) -> JournalEntry | None:
        """The first journaled call the program has not made (it now ends earlier)."""
        later = [seq for seq in self.entries if seq > self.seq]
        return self.entries[min(later)] if later else None

    def next(self, call: str) -> JournalEntry | None:
        """Take the next sequence number for ``call``: its entry when it was journaled before."""
        if self.lost.is_set():
            raise _Fenced
        if self.divergence is not None:
            raise self.divergence
        self.seq += 1
        entry = self.entries.get(self.seq)
        if entry is None:
            return None
        if entry.call != call:
            self.divergence = NonDeterminismError(
                f"non-deterministic pipeline: call #{self.seq} is {call!r} but the journal recorded "
                f"{entry.call!r}; the program changed since this run started",
                seq=self.seq,
                journaled=entry.call,
                called=call,
            )
            raise self.divergence
        return entry

    # --- the fence ----------------------------------------------------------------------------

    def _db(self, value: uuid.UUID) -> Any:
        return value if is_postgresql() else value.hex

    def fence(self, *, lock: bool = True) -> Run:
        """Check this execution still holds the run (its lease, and the run is running), or
        raise ``_Fenced``. ``lock``: lock the run's row for the rest of the transaction, so
        that what is written next commits with the check (inside ``transaction.atomic``);
        without it, one read (a check between steps)."""
        query = Run.objects.filter(pk=self.run.pk, lease_token=self.token, status=RunStatus.RUNNING)
        run = query.select_for_update(no_key=True).first() if lock else (self.run if query.exists() else None)
        if run is None:
            self.lost.set()
            raise _Fenced
        return run

    def write(self, seq: int, call: str, status: str, result: Any = None, error: str = "") -> None:
        """Insert or complete the entry ``seq`` in one statement that is itself fenced (it
        writes nothing unless this execution holds the run)."""
        now = timezone.now()
        fence = "EXISTS (SELECT 1 FROM pipelines_run WHERE id = %s AND lease_token = %s AND status = %s)"
        fence_params = [self._db(self.run.pk), self._db(self.token), RunStatus.RUNNING]
        cast = "::jsonb" if is_postgresql() else ""
        payload = json.dumps(result)
        error = error.replace("\x00", "\\x00")  # PostgreSQL text cannot hold NUL (an exception's message may)
        done = now if status != EntryStatus.STARTED else None
        with connection.cursor() as cursor:
            if seq in self.entries:
                cursor.execute(
                    f"UPDATE pipelines_journalentry SET status = %s, result = %s{cast}, error = %s, completed_at = %s "  # noqa: S608
                    f"WHERE run_id = %s AND seq = %s AND {fence}",
                    [status, payload, error, done, self._db(self.run.pk), seq, *fence_params],
                )
            else:
                cursor.execute(
                    "INSERT INTO pipelines_journalentry "
                    "(run_id, seq, call, status, result, error, created_at, completed_at) "
                    f"SELECT %s, %s, %s, %s, %s{cast}, %s, %s, %s WHERE {fence}",
                    [self._db(self.run.pk), seq, call, status, payload, error, now, done, *fence_params],
                )
            if cursor.rowcount != 1:
                self.lost.set()
                raise _Fenced
        self.entries[seq] = JournalEntry(
            run_id=self.run.pk, seq=seq, call=call, status=status, result=result, error=error, created_at=now
        )

    # --- the one shape of an acting call ------------------------------------------------------

    def act(
        self,
        seq: int,
        call: str,
        do: Callable[[Run], T],
        journaled: Callable[[T], Any],
        *,
        refused: str,
        status: str = EntryStatus.COMPLETED,
        record_id: str = "",
    ) -> T:
        """Lock the run and check the fence, call a service (``do(run)``), and journal what it
        returned (``journaled(value)``) in the same transaction, so the effect and its entry
        commit together. A service's refusal is journaled too (as ``"<refused>: <why>"``: the
        sequence stays dense and replay raises the same error) and raised as ``ResourceFailed``."""
        failure = ""
        with transaction.atomic():
            run = self.fence()
            try:
                value = do(run)
            except (ServiceError, ResourceFailed) as exc:
                failure = f"{refused}: {getattr(exc, 'detail', exc)}"
                self.write(seq, call, EntryStatus.FAILED, None, failure)
            else:
                self.write(seq, call, status, journaled(value))
        if failure:
            raise ResourceFailed(failure, record_id=record_id)
        return value

    def refuse(self, seq: int, call: str, failure: str, *, record_id: str = "") -> ResourceFailed:
        """Journal a refusal found before acting (the sequence stays dense); the error to raise."""
        self.write(seq, call, EntryStatus.FAILED, None, failure)
        return ResourceFailed(failure, record_id=record_id)
