"""Protected records, through the services: deletion stops at a protected record (it and what
it owns stay, its owners up to the deleted one wait with one ``deletion_blocked`` event each),
the rest goes children first, and unprotecting finishes the deletion. Tasks run eagerly inside
captured on-commit callbacks; tests/records/test_protect_system.py proves the same on workers.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from apps.core.errors import Conflict, ValidationFailed
from apps.core.models import AuditEntry
from apps.records import services
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from apps.records.services import delete
from kinds.testing import objects_of
from tests import factories

pytestmark = pytest.mark.django_db


def fresh(record: Record) -> Record:
    return Record.objects.get(pk=record.pk)


def phase(record: Record) -> str:
    return fresh(record).phase


def blocked_events(record: Record) -> list[Event]:
    return list(Event.objects.filter(record=record, type=EventType.DELETION_BLOCKED).order_by("id"))


def deleted_order(*records: Record) -> list[Any]:
    """The records' ids in the order they were deleted."""
    ids = [r.pk for r in records]
    events = Event.objects.filter(record_id__in=ids, type=EventType.PHASE_CHANGED, data__to=Phase.DELETED)
    return list(events.order_by("id").values_list("record_id", flat=True))


def build(capture: Any) -> dict[str, Record]:
    """run -> env -> db (protected) -> volume; env -> cache; run -> web: all ready."""
    root = factories.run("r")
    with capture(execute=True):
        env = factories.sleep(root, "env")
        db = services.record_declare(kind="test.sleep", name="db", owner=env, protect=True)
        volume = factories.sleep(db, "volume")
        cache = factories.sleep(env, "cache")
        web = factories.sleep(root, "web")
    return {"root": root, "env": env, "db": db, "volume": volume, "cache": cache, "web": web}


def test_a_declaration_protects_and_says_who(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    tree = build(django_capture_on_commit_callbacks)
    db = fresh(tree["db"])
    assert (db.protected, db.protected_by) == (True, "system:graphene")
    assert db.protected_at is not None
    event = Event.objects.get(record=db, type=EventType.PROTECTED)
    assert event.data == {"by": "system:graphene", "declared": True}
    created = AuditEntry.objects.get(action="record.create", object_id=str(db.pk))
    assert created.after_digest  # the declaration's row covers the protection with the rest
    # A re-declaration without protect leaves it; one with protect adds it to a record without.
    services.record_declare(kind="test.sleep", name="db", owner=tree["env"])
    assert fresh(db).protected
    services.record_declare(kind="test.sleep", name="cache", owner=tree["env"], protect=True)
    assert fresh(tree["cache"]).protected
    assert AuditEntry.objects.filter(action="record.protect", object_id=str(tree["cache"].pk)).count() == 1


def test_deleting_an_owner_stops_at_the_protected_record_and_unprotect_finishes_it(
    eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    tree = build(django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        services.record_delete_request(record=tree["root"])
    # The rest went, children first; the protected record, what it owns and its owners stay.
    assert [phase(tree[n]) for n in ("cache", "web")] == [Phase.DELETED, Phase.DELETED]
    assert [phase(tree[n]) for n in ("root", "env", "db", "volume")] == [Phase.READY] * 4
    assert all(fresh(tree[n]).deletion_requested_at is not None for n in ("root", "env", "db", "volume"))
    assert objects_of(str(tree["db"].pk))
    assert objects_of(str(tree["volume"].pk))
    # One event on the protected record and on each owner that waits, naming it.
    for name in ("db", "env", "root"):
        (event,) = blocked_events(tree[name])
        assert event.reason == "DeletionBlocked"
        assert event.data["protected"] == str(tree["db"].pk)
    assert "test.sleep/db" in blocked_events(tree["env"])[0].message
    assert blocked_events(tree["volume"]) == []
    # Nothing for the reconciler to chase while it waits, and asking again tells nothing new.
    waiting = [tree[n] for n in ("root", "env", "db", "volume")]
    assert all(fresh(r).next_attempt_at is None for r in waiting)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.records_reconcile(now=timezone.now() + timedelta(hours=1)) == 0
        services.record_delete_request(record=tree["root"])
        services.record_delete_batch(record_ids=[str(tree["volume"].pk), str(tree["db"].pk)])
    assert [len(blocked_events(tree[n])) for n in ("db", "env", "root")] == [1, 1, 1]
    assert [phase(r) for r in waiting] == [Phase.READY] * 4

    with django_capture_on_commit_callbacks(execute=True):
        services.record_unprotect(record=tree["db"])
    assert {phase(r) for r in tree.values()} == {Phase.DELETED}
    order = deleted_order(*waiting)
    assert order == [tree[n].pk for n in ("volume", "db", "env", "root")], "children first"
    unprotected = Event.objects.get(record=tree["db"], type=EventType.UNPROTECTED)
    assert unprotected.data["deletion_resumed"] is True
    assert objects_of(str(tree["db"].pk)) == []


def test_deleting_the_protected_record_itself_waits(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    tree = build(django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        services.record_delete_request(record=tree["db"])
    assert [phase(tree[n]) for n in ("db", "volume", "env")] == [Phase.READY] * 3
    assert fresh(tree["env"]).deletion_requested_at is None
    assert len(blocked_events(tree["db"])) == 1
    assert blocked_events(tree["env"]) == []  # env is not being deleted
    with django_capture_on_commit_callbacks(execute=True):
        services.record_unprotect(record=tree["db"])
    assert [phase(tree[n]) for n in ("db", "volume", "env")] == [Phase.DELETED, Phase.DELETED, Phase.READY]


def test_a_ttl_expiring_stops_at_the_protected_record(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    tree = build(django_capture_on_commit_callbacks)
    soon = timezone.now() + timedelta(seconds=30)
    services.record_set_expiry(record=tree["env"], expires_at=soon)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.records_expire(now=soon + timedelta(seconds=1)) == 1
        assert services.records_expire(now=soon + timedelta(seconds=2)) == 0
    assert phase(tree["cache"]) == Phase.DELETED
    assert [phase(tree[n]) for n in ("env", "db", "volume")] == [Phase.READY] * 3
    assert [len(blocked_events(tree[n])) for n in ("db", "env", "root")] == [1, 1, 0]


def test_its_own_ttl_running_out_stops_at_the_protected_record(
    eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    tree = build(django_capture_on_commit_callbacks)
    soon = timezone.now() + timedelta(seconds=30)
    services.record_set_expiry(record=tree["db"], expires_at=soon)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.records_expire(now=soon + timedelta(seconds=1)) == 1
        assert services.records_expire(now=soon + timedelta(hours=1)) == 0  # not again
    assert [phase(tree[n]) for n in ("db", "volume")] == [Phase.READY] * 2
    assert [len(blocked_events(tree[n])) for n in ("db", "env")] == [1, 0]
    with django_capture_on_commit_callbacks(execute=True):
        services.record_unprotect(record=tree["db"])
    assert [phase(tree[n]) for n in ("volume", "db", "env")] == [Phase.DELETED, Phase.DELETED, Phase.READY]


def test_what_was_being_deleted_below_before_protection_goes_on(
    eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    """Protection holds what a deletion reaches through the protected record, not a deletion
    of something below it requested on its own before."""
    tree = build(django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        services.record_delete_request(record=tree["volume"])
    assert phase(tree["volume"]) == Phase.DELETED
    assert phase(tree["db"]) == Phase.READY
    assert blocked_events(tree["db"]) == []


def test_a_protected_record_inside_a_protected_one(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    """Unprotecting the outer one lets what is not held by the inner one go; the inner one's
    owners, the outer one now among them, wait on it and are told so."""
    tree = build(django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        inner = services.record_declare(kind="test.sleep", name="inner", owner=tree["volume"], protect=True)
        spare = factories.sleep(tree["db"], "spare")
    with django_capture_on_commit_callbacks(execute=True):
        services.record_delete_request(record=tree["root"])
        services.record_unprotect(record=tree["db"])
    assert phase(spare) == Phase.DELETED
    assert [phase(tree[n]) for n in ("root", "env", "db", "volume")] == [Phase.READY] * 4
    assert phase(inner) == Phase.READY
    for name in ("volume", "db", "env", "root"):
        assert [e.data["protected"] for e in blocked_events(tree[name])][-1] == str(inner.pk), name
    with django_capture_on_commit_callbacks(execute=True):
        services.record_unprotect(record=inner)
    assert {phase(r) for r in [*tree.values(), inner, spare]} == {Phase.DELETED}


def test_a_held_record_reached_by_a_lost_message_waits(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    """A batch naming a held record (a redelivery, the reconciler before the hold) leaves it:
    no delete, no lease; the reconciler skips it."""
    tree = build(django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=False):
        services.record_delete_request(record=tree["root"])
    Record.objects.filter(pk=tree["volume"].pk).update(next_attempt_at=timezone.now())
    with django_capture_on_commit_callbacks(execute=False), transaction.atomic():
        assert delete._claim([str(tree["volume"].pk)]) is None
    assert phase(tree["volume"]) == Phase.READY
    assert fresh(tree["volume"]).next_attempt_at is None
    Record.objects.filter(pk=tree["volume"].pk).update(next_attempt_at=timezone.now())
    with django_capture_on_commit_callbacks(execute=False) as sent:
        assert services.records_reconcile(now=timezone.now() + timedelta(seconds=1)) == 0
    assert sent == []
    assert fresh(tree["volume"]).next_attempt_at is None


def test_unprotect_gives_the_waiting_records_a_lease(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    """If the tasks unprotect enqueues are lost, the reconciler finishes the deletion."""
    tree = build(django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=False):
        services.record_delete_request(record=tree["env"])
    services.record_delete_batch(record_ids=[str(tree["cache"].pk)])
    with django_capture_on_commit_callbacks(execute=False):  # its messages are lost
        services.record_unprotect(record=tree["db"])
    assert all(fresh(tree[n]).next_attempt_at is not None for n in ("env", "db", "volume"))
    for _ in range(4):
        with django_capture_on_commit_callbacks(execute=True):
            services.records_reconcile(now=timezone.now() + timedelta(hours=1))
    assert [phase(tree[n]) for n in ("volume", "db", "env", "root")] == [Phase.DELETED] * 3 + [Phase.READY]


def test_protect_and_unprotect_write_events_and_audit_rows(django_user_model: Any) -> None:
    ada = django_user_model.objects.create_superuser(username="ada", password="pw")
    root = factories.run()
    record = factories.sleep(root, "db")
    services.record_protect(record=record, actor=ada)
    services.record_protect(record=record, actor=ada)  # already protected: nothing changes
    protected = fresh(record)
    assert (protected.protected, protected.protected_by) == (True, "user:ada")
    services.record_unprotect(record=record, actor=ada)
    services.record_unprotect(record=record, actor=ada)
    assert (fresh(record).protected, fresh(record).protected_by, fresh(record).protected_at) == (False, "", None)
    events = Event.objects.filter(record=record, type__in=[EventType.PROTECTED, EventType.UNPROTECTED])
    assert [(e.type, e.actor_id) for e in events.order_by("id")] == [
        (EventType.PROTECTED, ada.pk),
        (EventType.UNPROTECTED, ada.pk),
    ]
    rows = AuditEntry.objects.filter(object_id=str(record.pk), action__in=["record.protect", "record.unprotect"])
    assert [(r.action, r.actor_name) for r in rows.order_by("id")] == [
        ("record.protect", "ada"),
        ("record.unprotect", "ada"),
    ]


def test_protect_refuses_roots_deleted_records_and_deletions_under_way(
    eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    root = factories.run()
    with django_capture_on_commit_callbacks(execute=True):
        gone = factories.sleep(root, "gone")
        going = factories.sleep(root, "going", delete_ms=0)
        services.record_delete_request(record=gone)
    with pytest.raises(ValidationFailed, match="root"):
        services.record_protect(record=root)
    with pytest.raises(Conflict, match="is deleted; only a live record can be protected"):
        services.record_protect(record=gone)
    with pytest.raises(Conflict, match="is deleted"):
        services.record_unprotect(record=gone)
    with django_capture_on_commit_callbacks(execute=False):
        services.record_delete_request(record=going)
    with pytest.raises(Conflict, match="is being deleted"):
        services.record_protect(record=going)
    assert not Record.objects.filter(protected=True).exists()
    assert not Event.objects.filter(type=EventType.PROTECTED).exists()


def test_the_sql_of_a_held_row_says_what_the_query_says(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    """Deletion batches ask in raw SQL (``HELD_SQL``) what the querysets ask with ``_held()``:
    for every row of a tree with protected records requested at different times, both agree."""
    from django.db import connection

    from apps.records.services.transitions import HELD_SQL, _held

    built = build(django_capture_on_commit_callbacks)
    now = timezone.now()
    db, env = built["db"], built["env"]
    with django_capture_on_commit_callbacks(execute=True):
        logs = factories.sleep(db, "logs")
    Record.objects.filter(pk=logs.pk).update(deletion_requested_at=now - timedelta(seconds=15))
    # The env (unprotected) first, then the protected db; inside db the volume before db (its
    # own deletion goes on) and the logs after it (held); the web (beside them) last.
    Record.objects.filter(pk=env.pk).update(deletion_requested_at=now - timedelta(seconds=30))
    Record.objects.filter(pk=db.pk).update(deletion_requested_at=now - timedelta(seconds=20))
    Record.objects.filter(pk=built["volume"].pk).update(deletion_requested_at=now - timedelta(seconds=25))
    Record.objects.filter(pk=built["cache"].pk).update(deletion_requested_at=now - timedelta(seconds=40))
    Record.objects.filter(pk=built["web"].pk).update(deletion_requested_at=now - timedelta(seconds=10))
    tree = Record.objects.filter(tree_id=db.tree_id)
    by_query = dict(tree.annotate(is_held=_held()).values_list("pk", "is_held"))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT r.id, {HELD_SQL.format(row='r')} FROM records_record r WHERE r.tree_id = %s",  # noqa: S608
            [db.tree_id],
        )
        by_sql = dict(cursor.fetchall())
    assert by_sql == by_query
    assert by_query == {
        built["root"].pk: False,
        env.pk: False,  # above db
        db.pk: True,  # by itself
        built["volume"].pk: False,  # requested before db was
        logs.pk: True,  # requested after db was: held by db
        built["cache"].pk: False,  # beside db
        built["web"].pk: False,
    }
