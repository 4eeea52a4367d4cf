"""Domain events: the pinned list of events and subscribers, delivery after commit, and
subscribers that fail without touching the work that emitted them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction

from apps.core import domain
from apps.records import services
from apps.records.choices import Phase
from apps.records.models import Record

# The contract docs/events.md describes: change both together.
EVENTS = [
    "RecordsSettled",
    "RecordConverged",
    "RecordConvergeFailed",
    "RecordsDeleted",
    "RecordDrifted",
    "CommandFinished",
    "WorkerLost",
]
SUBSCRIPTIONS = [
    ("RecordsSettled", "apps.pipelines.services.lifecycle.runs_wake_on_records"),
    ("RecordConverged", "apps.observability.subscribers.record_converged"),
    ("RecordConvergeFailed", "apps.observability.subscribers.record_converge_failed"),
    ("RecordsDeleted", "apps.observability.subscribers.records_deleted"),
    ("RecordDrifted", "apps.observability.subscribers.record_drifted"),
    ("CommandFinished", "apps.observability.subscribers.command_finished"),
    ("CommandFinished", "apps.agents.services.commands.record_wake_on_command"),
    ("CommandFinished", "apps.pipelines.services.lifecycle.runs_wake_on_command"),
    ("WorkerLost", "apps.records.services.housekeeping.records_take_over_on_worker_lost"),
    ("WorkerLost", "apps.pipelines.services.recovery.runs_take_over_on_worker_lost"),
]


def test_the_events_and_their_subscribers_are_the_documented_ones() -> None:
    assert [event.__name__ for event in domain.EVENTS] == EVENTS
    assert sorted(domain.subscriptions()) == sorted(SUBSCRIPTIONS)
    with open("docs/events.md") as page:
        text = page.read()
    for event in EVENTS:
        assert f"`{event}(" in text, f"docs/events.md does not describe {event}"
    for _event, subscriber in SUBSCRIPTIONS:
        assert f"`{subscriber.rsplit('.', 1)[-1]}`" in text, f"docs/events.md does not name {subscriber}"


class Probe:
    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[Any] = []

    def __call__(self, event: Any) -> None:
        self.seen.append(event)
        if self.fail:
            raise RuntimeError("the probe subscriber fails")


@pytest.fixture
def probes() -> Iterator[tuple[Probe, Probe]]:
    """A failing subscriber of RecordsSettled, and a second one after it."""
    failing, after = Probe(fail=True), Probe()
    domain.subscribe(domain.RecordsSettled, failing)
    domain.subscribe(domain.RecordsSettled, after)
    yield failing, after
    domain.unsubscribe(domain.RecordsSettled, failing)
    domain.unsubscribe(domain.RecordsSettled, after)


def _declared() -> Record:
    root = services.record_create_root(kind="graphene.stand", name="domain-events")
    return services.record_declare(kind="file", name="f", owner=root, spec={"path": "domain/f.txt", "content": "x"})


@pytest.mark.django_db(transaction=True)
def test_a_failing_subscriber_is_counted_and_rolls_nothing_back(probes: tuple[Probe, Probe]) -> None:
    failing, after = probes
    record = _declared()
    counted = domain.failures().get(("RecordsSettled", f"{Probe.__module__}.{Probe.__qualname__}"), 0)
    services.record_converge(record_id=record.pk)  # pending → creating → ready: settles, commits
    record.refresh_from_db()
    assert record.phase == Phase.READY
    assert [e.record_ids for e in failing.seen] == [(str(record.pk),)]
    assert [e.record_ids for e in after.seen] == [(str(record.pk),)], "the next subscriber still ran"
    name = next(key for key in domain.failures() if key[0] == "RecordsSettled" and "Probe" in key[1])
    assert domain.failures()[name] > counted


@pytest.mark.django_db(transaction=True)
def test_subscribers_run_after_commit_and_never_for_a_rollback(probes: tuple[Probe, Probe]) -> None:
    _failing, after = probes
    event = domain.RecordsSettled(record_ids=("x",))
    with transaction.atomic():
        domain.emit(event)
        assert after.seen == [], "delivered before the commit"
    assert after.seen == [event]

    def rolled_back() -> None:
        with transaction.atomic():
            domain.emit(domain.RecordsSettled(record_ids=("rolled back",)))
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        rolled_back()
    assert after.seen == [event]
    domain.emit(domain.RecordsSettled(record_ids=("no transaction",)))
    assert after.seen[-1].record_ids == ("no transaction",)


def test_only_domain_events_can_be_subscribed_to() -> None:
    class NotAnEvent(domain.DomainEvent):
        pass

    with pytest.raises(TypeError, match="not a domain event"):
        domain.subscribe(NotAnEvent, Probe())
