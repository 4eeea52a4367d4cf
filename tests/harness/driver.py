"""The in-process driver: Celery tasks run in the test's own process, until nothing is left.

For tests of engine semantics (replay, suspend and resume, the journal, retries) that promise
nothing about processes. Every task sent (``delay``/``apply_async``, from on-commit callbacks
too: a transactional test commits for real, so they fire at once) is captured with its ETA
instead of going to the broker; ``Driver.run_until`` executes the due ones in order, one at a
time, in this thread, waiting for the next ETA when only later ones are left (a durable timer
is a task with a countdown), until a condition holds or nothing is left, within a deadline.

Tasks run as a worker would run them, through ``Task.apply``: the same task bodies, the same
services, the same database. What this layer cannot show (parallel convergence, crashes,
leases, several workers) stays with tests on real worker processes.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery.app.task import Task


@dataclass(order=True)
class Sent:
    """A task sent while the driver is installed: due at ``eta`` (monotonic seconds)."""

    eta: float
    order: int
    name: str = field(compare=False)
    task: Any = field(compare=False, repr=False)
    args: tuple[Any, ...] = field(compare=False)
    kwargs: dict[str, Any] = field(compare=False)


class Driver:
    """Captures task sends and runs them in this process (see the module docstring)."""

    def __init__(self) -> None:
        self._pending: list[Sent] = []
        self._lock = threading.Lock()
        self._order = itertools.count()
        self.executed: list[str] = []

    def capture(self, task: Task, args: Any = None, kwargs: Any = None, countdown: float | None = None,
                eta: Any = None, **options: Any) -> None:  # fmt: skip
        """Stands in for ``Task.apply_async``: remember the task and when it is due."""
        due = time.monotonic() + max(0.0, float(countdown or 0))
        if eta is not None:
            from django.utils import timezone

            due = time.monotonic() + max(0.0, (eta - timezone.now()).total_seconds())
        sent = Sent(due, next(self._order), task.name, task, tuple(args or ()), dict(kwargs or {}))
        with self._lock:
            heapq.heappush(self._pending, sent)

    @property
    def pending(self) -> list[Sent]:
        with self._lock:
            return sorted(self._pending)

    def _next_due(self, only: str | None) -> Sent | None:
        with self._lock:
            now = time.monotonic()
            for sent in sorted(self._pending):
                if sent.eta > now:
                    return None
                if only is None or sent.name == only:
                    self._pending.remove(sent)
                    heapq.heapify(self._pending)
                    return sent
            return None

    def run_until(
        self,
        condition: Callable[[], Any] | None = None,
        *,
        timeout: float = 30.0,
        what: str = "",
        only: str | None = None,
    ) -> Any:
        """Run due tasks until ``condition`` holds (its value is returned) or, without one, until
        no task is left at all; fail at the deadline, naming what was still pending.

        ``only`` (a task name) runs just those tasks and leaves the others pending: an
        interleaving the test chooses, e.g. a run that goes before the record it waits on."""
        deadline = time.monotonic() + timeout
        while True:
            if condition is not None:
                value = condition()
                if value:
                    return value
            sent = self._next_due(only)
            if sent is not None:
                self.executed.append(sent.name)
                sent.task.apply(args=sent.args, kwargs=sent.kwargs, throw=True)
                continue
            pending = [s for s in self.pending if only is None or s.name == only]
            if condition is None and not pending:
                return True
            if time.monotonic() > deadline:
                left = ", ".join(f"{s.name}{s.args} in {s.eta - time.monotonic():.1f}s" for s in pending) or "none"
                raise AssertionError(
                    f"timed out after {timeout}s driving tasks for {what or condition}; pending: {left}"
                )
            # Nothing is due: wait for the earliest ETA (a durable timer), or for another thread's send.
            next_eta = pending[0].eta if pending else time.monotonic() + 0.05
            time.sleep(min(max(next_eta - time.monotonic(), 0.0), 0.05, max(deadline - time.monotonic(), 0.0)))

    def settle(self, *, timeout: float = 30.0) -> None:
        """Run tasks until none is left (later ETAs included)."""
        self.run_until(None, timeout=timeout)
