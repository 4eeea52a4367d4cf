"""Protected records against real Celery workers, PostgreSQL and Redis: a run's end, an explicit
delete of an owner and an owner's TTL each stop at a protected record — it, what it owns and its
owners stay (told once, with a ``deletion_blocked`` event naming it), the rest is deleted
children first — and unprotecting (over REST, with graphenectl, through the services) finishes
the deletion, children first."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.core.models import AuditEntry
from apps.pipelines import services as pipelines
from apps.pipelines.choices import TERMINAL, RunStatus
from apps.pipelines.models import JournalEntry, Run
from apps.records import services
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from kinds.testing import objects_of
from tests import factories
from tests.conftest import Worker, running_beat, wait_for
from tests.harness.driver import Driver
from tests.harness.embedded import Ctl
from tests.harness.web import WebServer
from tests.pipelines.sample import effects_file

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def fresh(record: Record) -> Record:
    return Record.objects.get(pk=record.pk)


def all_in(records: list[Record], phase: str) -> bool:
    return Record.objects.filter(pk__in=[r.pk for r in records]).exclude(phase=phase).count() == 0


def blocked(record: Record) -> list[str]:
    """The protected records the record's ``deletion_blocked`` events name."""
    events = Event.objects.filter(record=record, type=EventType.DELETION_BLOCKED).order_by("id")
    return [e.data["protected"] for e in events]


def span(record: Record) -> tuple[datetime, datetime]:
    """When the record's own delete began (``deleting``) and when it was ``deleted``."""
    events = Event.objects.filter(record=record, type=EventType.PHASE_CHANGED)
    start = events.filter(data__to=Phase.DELETING).order_by("id").first()
    end = events.get(data__to=Phase.DELETED)
    assert start is not None
    return start.created_at, end.created_at


def assert_children_first(*chain: Record) -> None:
    """Each record of ``chain`` (child first) was deleted before its owner's delete began."""
    for child, owner in itertools.pairwise(chain):
        assert span(child)[1] <= span(owner)[0], f"{owner} began deleting before {child} was gone"


def waits(records: list[Record]) -> bool:
    """Each is live, its deletion requested, and nothing chases it (no lease)."""
    rows = [fresh(r) for r in records]
    return all(r.phase == Phase.READY and r.deletion_requested_at and r.next_attempt_at is None for r in rows)


def test_a_cancelled_run_ends_its_deletion_stops_at_the_protected_record_and_unprotect_finishes_it(
    workers: list[Worker], api: APIClient
) -> None:
    run = pipelines.run_start(pipeline_name="sample.protect", inputs={})

    def declared() -> dict[str, Record] | None:
        root = Run.objects.get(pk=run.pk).record_id
        found = {r.name: r for r in Record.objects.filter(created_by_run_id=root)} if root else {}
        ready = len(found) == 5 and all(r.phase == Phase.READY for r in found.values())
        return found if ready and Run.objects.get(pk=run.pk).status == RunStatus.SUSPENDED else None

    records = wait_for(declared, timeout=60, what="the run's five records ready and the run asleep")
    assert records is not None
    db, env, volume = records["db"], records["env"], records["volume"]
    root = Record.objects.get(children=env)  # the run's root record
    assert db.protected
    assert db.protected_by.startswith("run:sample.protect#")

    pipelines.run_cancel(run=Run.objects.get(pk=run.pk))
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED  # the run ends at once
    wait_for(lambda: all_in([records["cache"], records["web"]], Phase.DELETED), timeout=60, what="the rest deleted")
    # The protected record and what it owns stay, and so do its owners up to the run's root.
    wait_for(lambda: waits([root, env, db, volume]), timeout=30, what="the blocked owners to wait")
    assert objects_of(str(db.pk)) != []
    assert objects_of(str(volume.pk)) != []
    # Told once each, and not again by the reconciler or another request.
    for _ in range(3):
        services.records_reconcile(now=timezone.now() + timedelta(minutes=5))
    services.record_delete_request(record=root, reason="Again")
    assert (blocked(db), blocked(env), blocked(root), blocked(volume)) == ([str(db.pk)], [str(db.pk)], [str(db.pk)], [])
    assert waits([root, env, db, volume])

    response = api.post(f"/api/v1/records/{db.pk}/unprotect/")
    assert response.status_code == 200, response.content
    wait_for(lambda: all_in([root, env, db, volume], Phase.DELETED), timeout=60, what="the deletion to finish")
    assert_children_first(volume, db, env, root)
    assert objects_of(str(db.pk)) == []
    assert objects_of(str(volume.pk)) == []
    event = Event.objects.get(record=db, type=EventType.UNPROTECTED)
    assert event.actor is not None
    assert event.actor.get_username() == "alice"
    assert AuditEntry.objects.get(action="record.unprotect", object_id=str(db.pk)).actor_name == "alice"
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED


@pytest.fixture
def ctl(web: WebServer, user: Any, tmp_path: Path) -> Ctl:
    """graphenectl as alice (a developer in the default namespace) on the shared web server."""
    return Ctl(tmp_path / "config", **web.client_env(), GRAPHENE_TOKEN=factories.api_token(user))


def test_deleting_the_owner_of_a_protected_record_with_graphenectl(workers: list[Worker], ctl: Ctl) -> None:
    stand = factories.stand()
    env = factories.sleep(stand, "env")
    db = factories.sleep(env, "db")
    cache = factories.sleep(env, "cache")
    wait_for(lambda: all_in([env, db, cache], Phase.READY), what="ready")

    protected = ctl.ok("protect", str(db.pk))
    assert protected.out.strip() == f"record/{db.pk}"
    assert f"record/{db.pk} is protected (by user:alice)" in protected.err
    assert ctl.ok("protect", str(db.pk), "-o", "json").json()["protected_by"] == "user:alice"
    header, row = ctl.ok("get", "records", "--owner", str(env.pk), "--name-prefix", "db", "-o", "wide").out.splitlines()
    assert row.split()[header.split().index("PROTECTED")] == "user:alice"
    assert "Protected" in ctl.ok("describe", str(db.pk)).out

    deleting = ctl.ok("delete", str(env.pk))
    assert f"the deletion stops at protected test.sleep/db ({db.pk})" in deleting.err
    wait_for(lambda: fresh(cache).phase == Phase.DELETED, timeout=60, what="the cache deleted")
    wait_for(lambda: waits([env, db]), timeout=30, what="env and db to wait")
    assert (blocked(env), blocked(db), blocked(stand)) == ([str(db.pk)], [str(db.pk)], [])
    described = ctl.ok("describe", str(env.pk)).out
    assert f"blocked: waits on protected test.sleep/db ({db.pk})" in " ".join(described.split())
    refused = ctl("delete", str(env.pk), "--wait", "--timeout", "2s")
    assert refused.code == 1
    assert f"graphenectl unprotect {db.pk}" in refused.err

    unprotected = ctl.ok("unprotect", str(db.pk))
    assert "its deletion goes on" in unprotected.err
    wait_for(lambda: all_in([env, db], Phase.DELETED), timeout=60, what="env and db deleted")
    assert_children_first(db, env)
    assert fresh(stand).phase == Phase.READY
    rows = AuditEntry.objects.filter(object_id=str(db.pk), action__in=["record.protect", "record.unprotect"])
    assert [(r.action, r.actor_name) for r in rows.order_by("id")] == [
        ("record.protect", "alice"),
        ("record.unprotect", "alice"),
    ]


def test_an_owners_ttl_running_out_stops_at_the_protected_record(workers: list[Worker], tmp_path: Path) -> None:
    stand = factories.stand()
    env = factories.sleep(stand, "env")
    db = services.record_declare(kind="test.sleep", name="db", owner=env, protect=True)
    cache = factories.sleep(env, "cache")
    wait_for(lambda: all_in([env, db, cache], Phase.READY), what="ready")
    services.record_set_expiry(record=env, expires_at=timezone.now() + timedelta(seconds=2))
    with running_beat(tmp_path):
        wait_for(lambda: fresh(cache).phase == Phase.DELETED, timeout=40, what="the expired owner's cache deleted")
        wait_for(lambda: waits([env, db]), timeout=30, what="env and db to wait")
    assert Event.objects.filter(record=env, type=EventType.EXPIRED).count() == 1
    assert (blocked(env), blocked(db)) == ([str(db.pk)], [str(db.pk)])
    assert fresh(stand).phase == Phase.READY
    services.record_unprotect(record=db)
    wait_for(lambda: all_in([env, db], Phase.DELETED), timeout=60, what="env and db deleted")
    assert_children_first(db, env)


def test_protect_is_part_of_the_journaled_declaration(drive: Driver) -> None:
    """A replay whose program no longer protects the record does not match its journal (I5)."""
    run = pipelines.run_start(pipeline_name="sample.protect", inputs={})
    drive.run_until(lambda: Run.objects.get(pk=run.pk).status == RunStatus.SUSPENDED, what="the run to sleep")
    entry = JournalEntry.objects.get(run=run, call__startswith="declare test.sleep/db")
    assert entry.call.endswith(" protected")
    effects_file(str(run.pk), "unprotect").write_text("the code changed")
    pipelines.run_resume(run=Run.objects.get(pk=run.pk))
    drive.run_until(lambda: Run.objects.get(pk=run.pk).status in TERMINAL, what="the run to end")
    ended = Run.objects.get(pk=run.pk)
    assert ended.status == RunStatus.FAILED
    assert f"call #{entry.seq}" in ended.error
    assert repr(entry.call) in ended.error
    assert repr(entry.call.removesuffix(" protected")) in ended.error
