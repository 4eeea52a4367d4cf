"""The runtime's own calls: checkpointed steps, durable timers and log lines."""

from __future__ import annotations

import contextvars
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime, timedelta
from typing import Any, NoReturn

from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from graphene_sdk import OutcomeUnknown, StepFailed, StepTimeout
from graphene_sdk._runtime import Guarantee

from apps.observability.services import log_write
from apps.pipelines.choices import EntryStatus
from apps.pipelines.engine.journal import _Fenced, _Suspend, result_of, to_json
from apps.pipelines.engine.state import ExecutionState


class _StepThreads:
    """This process's idle step threads, each a one-thread executor, kept for the next
    execution: starting a thread for each execution delayed every run's first step by the
    start. A thread goes back only when its last step has returned; it first closes the
    database connections the steps it ran opened (they belong to that thread)."""

    keep = 4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[ThreadPoolExecutor] = []
        self._pid = os.getpid()

    def _here(self) -> list[ThreadPoolExecutor]:
        """The idle executors of this process (under the lock): none after a fork, since those
        made before it have no thread here."""
        if self._pid != os.getpid():
            self._idle, self._pid = [], os.getpid()
        return self._idle

    def take(self) -> ThreadPoolExecutor:
        with self._lock:
            idle = self._here()
            if idle:
                return idle.pop()
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="step")

    def give_back(self, pool: ThreadPoolExecutor) -> None:
        pool.submit(connections.close_all)
        with self._lock:
            idle = self._here()
            if len(idle) < self.keep:
                idle.append(pool)
                return
        pool.shutdown(wait=False)


_step_threads = _StepThreads()


class StepCalls(ExecutionState):
    # The thread steps run in (one at a time); replaced when a step is abandoned.
    _pool: ThreadPoolExecutor | None
    _running: Future[Any] | None  # the last step handed to it

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        guarantee: Guarantee,
        timeout: float | None,
        retries: int,
    ) -> Any:
        call = f"step {name}"
        entry = self.journal.next(call)
        seq = self.journal.seq
        if entry is not None:
            if entry.status == EntryStatus.COMPLETED:
                return result_of(entry)["value"]
            if entry.status == EntryStatus.FAILED:
                info = entry.result or {}
                cls = StepTimeout if info.get("timeout") else StepFailed
                raise cls(entry.error, step=name, error_type=info.get("type", "Exception"))
            # STARTED (interrupted) or UNKNOWN: never run an at-most-once step twice.
            message = f"step {name!r} (at most once) was interrupted; it may or may not have taken effect"
            if entry.status == EntryStatus.STARTED:
                self.journal.write(seq, call, EntryStatus.UNKNOWN, None, message)
            raise OutcomeUnknown(message, step=name)
        if guarantee == "at_most_once":
            self.journal.write(seq, call, EntryStatus.STARTED)
        started_at = timezone.now()
        attempt = 0
        while True:
            attempt += 1
            try:
                raw = self._call(fn, args, kwargs, timeout, name)
                break
            except Exception as exc:  # StepTimeout included
                if attempt > retries:
                    self._step_failed(name, seq, call, exc, started_at, attempt, guarantee)
            self._pause(min(settings.GRAPHENE_RETRY_BASE_SECONDS * 2 ** (attempt - 1), 30.0))
        try:
            # Once, after the retries: running the step again would return the same value.
            value = to_json(raw)
        except (TypeError, ValueError) as exc:
            why = f"step {name!r} returned a value that cannot be journaled: {exc}"
            unjournaled = TypeError(why) if isinstance(exc, TypeError) else ValueError(why)
            self._step_failed(name, seq, call, unjournaled, started_at, attempt, guarantee)
        self.journal.write(seq, call, EntryStatus.COMPLETED, {"value": value})
        self.telemetry.step(name, seq, started_at, attempts=attempt, guarantee=guarantee)
        return value

    def _step_failed(
        self,
        name: str,
        seq: int,
        call: str,
        error: BaseException,
        started_at: datetime,
        attempts: int,
        guarantee: Guarantee,
    ) -> NoReturn:
        """Journal the step's failure and raise it (``StepTimeout`` or ``StepFailed``)."""
        is_timeout = isinstance(error, StepTimeout)
        text = str(error) if is_timeout else f"step {name!r} failed: {type(error).__name__}: {error}"
        self.journal.write(seq, call, EntryStatus.FAILED, {"type": type(error).__name__, "timeout": is_timeout}, text)
        self.telemetry.step(name, seq, started_at, attempts=attempts, guarantee=guarantee, error=text)
        cls = StepTimeout if is_timeout else StepFailed
        raise cls(text, step=name, error_type=type(error).__name__) from error

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = _step_threads.take()
        return self._pool

    def _abandon(self) -> None:
        """Leave a step thread that will not stop (timeout, cancel) and use a fresh one."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def _steps_done(self) -> None:
        """The execution ends: its step thread is kept for another one if its last step
        returned, else left to finish alone."""
        if self._pool is not None and (self._running is None or self._running.done()):
            _step_threads.give_back(self._pool)
            self._pool = None
        self._abandon()

    def _call(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None, name: str
    ) -> Any:
        """Run a step in a thread so that a cancel or a timeout does not wait for it."""
        # In the run's context (the audit trail's actor is the run, there too).
        future = self._running = self._executor().submit(contextvars.copy_context().run, fn, *args, **kwargs)
        started = time.monotonic()
        while True:
            wait = 0.5 if timeout is None else min(0.5, max(0.0, timeout - (time.monotonic() - started)))
            try:
                return future.result(timeout=wait)
            except FutureTimeout:
                pass
            if timeout is not None and time.monotonic() - started >= timeout:
                self._abandon()
                raise StepTimeout(f"step {name!r} timed out after {timeout:g}s", step=name, error_type="StepTimeout")
            try:
                self.journal.fence(lock=False)
            except _Fenced:
                self._abandon()
                raise

    def _pause(self, seconds: float) -> None:
        if self.journal.lost.wait(seconds):
            raise _Fenced

    def sleep(self, seconds: float) -> None:
        entry = self.journal.next("sleep")
        if entry is not None:
            wake_at = parse_datetime(result_of(entry)["wake_at"])
            assert wake_at is not None
        else:
            wake_at = timezone.now() + timedelta(seconds=seconds)
            result = {"wake_at": wake_at.isoformat(), "seconds": seconds}
            self.journal.write(self.journal.seq, "sleep", EntryStatus.COMPLETED, result)
        if timezone.now() < wake_at:
            raise _Suspend(wake_at=wake_at)

    def log(self, message: str, level: str) -> None:
        """A journaled call like the others: the line and its entry commit together (fenced),
        so a replay after a crash or a takeover never writes it a second time."""
        if self.journal.next("log") is not None:
            return
        with transaction.atomic():
            if self.run.record_id is not None:
                log_write(record_id=self.run.record_id, message=message, severity=level, source="run")
            self.journal.write(self.journal.seq, "log", EntryStatus.COMPLETED)
