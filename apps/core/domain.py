"""Domain events: how an app tells the apps above it what happened, without importing them.

An app lower in the stack (records, agents) *emits* a typed event where a state change
happens; the apps that care (pipelines wakes runs, observability writes spans and metrics)
*subscribe* to it in their ``AppConfig.ready()``. The emitter names no consumer, so the
dependency points one way: ``core`` ← ``records`` ← ``observability`` ← ... ← ``pipelines``
(see tests/test_architecture.py, which keeps it so).

Delivery. A subscriber runs when the emitter's transaction commits (at once when there is
none), in the order of subscription, so it never acts on a change that was rolled back and
never sits inside the emitter's locks. Events carry ids and values computed at the moment of
the change (``RecordRef`` snapshots, not model instances a later line of the emitter may
still modify).

Guarded. A subscriber that raises is logged and counted (``failures()``, exported as the
``graphene_subscriber_failures_total`` metric) and the next subscriber still runs; the
emitter's transaction is already committed and nothing is rolled back. Subscribers are hints
or telemetry that have their own safety nets (a run's recovery scan finds a lost wake-up).

Explicit, not Django signals: every event type is a class in this module, every subscription
one ``subscribe(...)`` line in an ``apps.py``; ``subscriptions()`` lists them, a test pins the
list and docs/events.md describes it.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.db import transaction

logger = logging.getLogger(__name__)


# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DomainEvent:
    """The base of every domain event. Subclasses are frozen dataclasses of plain values."""


@dataclass(frozen=True)
class RecordRef:
    """What a subscriber may know of a record, as it was when the event happened."""

    id: str
    kind: str
    name: str
    # The root record of the run whose tree it was declared in (a run's own root: itself); None
    # for records outside any run (a stand's holdings declared over the API, the sweeper).
    run_root_id: str | None
    generation: int
    attempts: int
    created_at: datetime
    deletion_requested_at: datetime | None


@dataclass(frozen=True)
class RecordsSettled(DomainEvent):
    """Records stopped converging: ready, create_failed, drifted, or their deletion began.
    Whatever waits on one of them (a suspended run's ``ready()``) can look again."""

    record_ids: tuple[str, ...]


@dataclass(frozen=True)
class RecordConverged(DomainEvent):
    """A convergence brought a record to ready: its first creation (``created``), an update to
    a new generation, or a heal after drift (``healed``)."""

    record: RecordRef
    started_at: datetime
    ended_at: datetime
    created: bool
    adopted: bool
    healed: bool


@dataclass(frozen=True)
class RecordConvergeFailed(DomainEvent):
    """A create or update attempt raised; it is retried with backoff or the record failed."""

    record: RecordRef
    started_at: datetime
    ended_at: datetime
    error: str


@dataclass(frozen=True)
class RecordsDeleted(DomainEvent):
    """A deletion batch ran the kinds' deletes: ``errors`` maps each record id to the error
    its delete raised (None: it is gone; the record is now ``deleted``)."""

    records: tuple[RecordRef, ...]
    errors: Mapping[str, str | None]
    started_at: datetime
    ended_at: datetime


@dataclass(frozen=True)
class RecordDrifted(DomainEvent):
    """Observation found a ready record's object differs from its spec, or is gone."""

    record: RecordRef
    gone: bool


@dataclass(frozen=True)
class CommandFinished(DomainEvent):
    """An agent command reached its end (succeeded, failed, cancelled, unknown).

    Names the command, never its payload: argv and env may carry secret values (I7).
    """

    command_id: str
    agent_id: str
    kind: str
    status: str
    guarantee: str
    deliveries: int
    program: str  # the base name of argv[0] for exec, else ""
    exit_code: int | None
    error: str
    created_at: datetime
    finished_at: datetime
    # The record whose convergence or deletion waits for it (a kind's call on a machine), or
    # None: a run waits on the command itself.
    waiting_record_id: str | None
    # True when its submitter waits for it in place and takes the result itself (a docker
    # request through an agent): its end has nobody to wake.
    awaited_in_place: bool
    log_record_ids: tuple[str, ...]


@dataclass(frozen=True)
class WorkerLost(DomainEvent):
    """A worker process stopped proving it is alive (``apps.core.workers``): what it held is
    to be taken over now, by whoever owns that work."""

    worker_id: str
    hostname: str
    pid: int
    beat_at: datetime  # its last heartbeat
    reason: str


# Every event type, in the order docs/events.md lists them.
EVENTS: tuple[type[DomainEvent], ...] = (
    RecordsSettled,
    RecordConverged,
    RecordConvergeFailed,
    RecordsDeleted,
    RecordDrifted,
    CommandFinished,
    WorkerLost,
)


# --- dispatch -------------------------------------------------------------------------------

E = TypeVar("E", bound=DomainEvent)
Subscriber = Callable[[Any], None]

_lock = threading.Lock()
_subscribers: dict[type[DomainEvent], list[Subscriber]] = {}
_failures: Counter[tuple[str, str]] = Counter()
_failure_hooks: list[Callable[[str, str], None]] = []


def _name(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{getattr(fn, '__qualname__', repr(fn))}"


def subscribe(event_type: type[E], subscriber: Callable[[E], None]) -> None:
    """Call ``subscriber(event)`` after each ``event_type`` commits. Idempotent (an
    ``AppConfig.ready()`` that runs twice subscribes once)."""
    if event_type not in EVENTS:
        raise TypeError(f"{event_type!r} is not a domain event of apps.core.domain")
    with _lock:
        found = _subscribers.setdefault(event_type, [])
        if subscriber not in found:
            found.append(subscriber)


def unsubscribe(event_type: type[E], subscriber: Callable[[E], None]) -> None:
    """Remove a subscription (tests that subscribe a probe take it away again)."""
    with _lock:
        found = _subscribers.get(event_type, [])
        if subscriber in found:
            found.remove(subscriber)


def on_subscriber_failure(hook: Callable[[str, str], None]) -> None:
    """``hook(event name, subscriber name)`` after a subscriber raised (observability counts it)."""
    with _lock:
        if hook not in _failure_hooks:
            _failure_hooks.append(hook)


def emit(event: DomainEvent) -> None:
    """Deliver ``event`` to its subscribers when the current transaction commits (now if none)."""
    subscribers = list(_subscribers.get(type(event), ()))
    if subscribers:
        transaction.on_commit(lambda: _deliver(event, subscribers))


def _deliver(event: DomainEvent, subscribers: list[Subscriber]) -> None:
    for subscriber in subscribers:
        try:
            subscriber(event)
        except Exception:
            names = (type(event).__name__, _name(subscriber))
            logger.warning("subscriber %s of %s failed", names[1], names[0], exc_info=True)
            with _lock:
                _failures[names] += 1
                hooks = list(_failure_hooks)
            for hook in hooks:
                try:
                    hook(*names)
                except Exception:  # counting a failure must not fail the next subscriber
                    logger.debug("failure hook %s failed", _name(hook), exc_info=True)


def subscriptions() -> list[tuple[str, str]]:
    """(event, subscriber) for every subscription, in delivery order."""
    with _lock:
        return [(event.__name__, _name(fn)) for event in EVENTS for fn in _subscribers.get(event, ())]


def failures() -> dict[tuple[str, str], int]:
    """Subscriber failures in this process since it started: (event, subscriber) → count."""
    with _lock:
        return dict(_failures)
