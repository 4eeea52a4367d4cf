"""Record services: declaration, phases, cascade order, retries, TTL, transfer, sweep, purge.

Tasks run eagerly here, inside captured on-commit callbacks; the same promises are proven
against real worker processes in test_system.py.
"""

from __future__ import annotations

import itertools
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.core.errors import Conflict, ValidationFailed
from apps.core.models import AuditEntry
from apps.records import services
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from apps.records.services import delete, transitions
from kinds.testing import objects_of
from tests import factories

pytestmark = pytest.mark.django_db


def phases(*records: Record) -> list[str]:
    return [Record.objects.get(pk=r.pk).phase for r in records]


def phase_events(record: Record) -> list[tuple[str, str]]:
    return [
        (e.data["from"], e.data["to"])
        for e in Event.objects.filter(record=record, type=EventType.PHASE_CHANGED).order_by("id")
    ]


def check_tree(tree_id: int) -> None:
    """mptt columns are consistent: each record inside its owner, siblings apart, no number
    used twice, and a record's free numbers (``tree_slack``) after its last child."""
    nodes = list(Record.objects.filter(tree_id=tree_id).order_by("lft"))
    by_id = {n.pk: n for n in nodes}
    bounds = [n.lft for n in nodes] + [n.rght for n in nodes]
    assert len(set(bounds)) == len(bounds), "no number is used twice"
    assert min(bounds) == 1
    children: dict[Any, list[Record]] = {n.pk: [] for n in nodes}
    for node in nodes:
        assert 0 <= node.tree_slack <= node.rght - node.lft - 1, node
        if node.parent_id is not None:
            parent = by_id[node.parent_id]
            assert parent.lft < node.lft < node.rght < parent.rght
            assert node.level == parent.level + 1
            children[parent.pk].append(node)
    for node in nodes:
        for left, right in itertools.pairwise(children[node.pk]):  # in lft order
            assert left.rght < right.lft, f"{left} and {right} overlap"
        if children[node.pk]:
            assert children[node.pk][-1].rght < node.rght - node.tree_slack, f"{node}'s free numbers are not free"


def test_declaration_commits_pending_before_convergence_is_enqueued(django_capture_on_commit_callbacks: Any) -> None:
    """I1: the record is committed in phase pending; the kind is only reached after commit."""
    owner = factories.run()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        record = factories.sleep(owner, "db")
        assert Record.objects.get(pk=record.pk).phase == Phase.PENDING
        assert objects_of(str(record.pk)) == []
    assert callbacks, "convergence must be enqueued on commit"
    assert objects_of(str(record.pk)) == [], "nothing outside exists before the task runs"
    assert [e.type for e in Event.objects.filter(record=record)] == [EventType.DECLARED]


def test_convergence_creates_once_and_adopts_on_retry(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    owner = factories.run()
    with django_capture_on_commit_callbacks(execute=True):
        record = factories.sleep(owner, "db", value=7)
    record.refresh_from_db()
    assert record.phase == Phase.READY
    assert record.outputs["value"] == 7
    assert record.outputs["adopted"] is False
    assert len(objects_of(str(record.pk))) == 1
    assert phase_events(record) == [("pending", "creating"), ("creating", "ready")]
    # A crash after the object was made but before the row said so: the retried create adopts.
    Record.objects.filter(pk=record.pk).update(phase=Phase.CREATING)
    services.record_converge(record_id=record.pk)
    record.refresh_from_db()
    assert record.phase == Phase.READY
    assert record.outputs["adopted"] is True
    assert len(objects_of(str(record.pk))) == 1


def test_redeclare_same_spec_returns_existing_and_new_spec_bumps_generation(
    eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    owner = factories.run()
    with django_capture_on_commit_callbacks(execute=True):
        first = factories.sleep(owner, "db", value=1)
        again = factories.sleep(owner, "db", value=1)
    assert again.pk == first.pk
    with django_capture_on_commit_callbacks(execute=True):
        changed = factories.sleep(owner, "db", value=2)
    changed.refresh_from_db()
    assert changed.pk == first.pk
    assert (changed.generation, changed.observed_generation, changed.phase) == (2, 2, Phase.READY)
    assert changed.outputs["value"] == 2
    assert ("ready", "updating") in phase_events(changed)


def test_a_sibling_still_being_deleted_keeps_its_name_until_it_is_gone(
    eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    owner = factories.run()
    with django_capture_on_commit_callbacks(execute=True):
        first = factories.sleep(owner, "db", value=1)
    with django_capture_on_commit_callbacks(execute=False):  # its deletion asked, not carried out
        services.record_delete_request(record=first)
    assert factories.sleep(owner, "db", value=1).pk == first.pk  # the same declaration: that record
    with pytest.raises(Conflict, match="is being deleted"):
        factories.sleep(owner, "db", value=2)
    assert Record.objects.filter(parent=owner, name="db").count() == 1
    with django_capture_on_commit_callbacks(execute=True):
        services.record_delete_request(record=Record.objects.get(pk=first.pk))  # now carried out
    assert Record.objects.get(pk=first.pk).phase == Phase.DELETED
    with django_capture_on_commit_callbacks(execute=True):
        second = factories.sleep(owner, "db", value=2)
    assert second.pk != first.pk


def test_create_retries_with_backoff_then_fails_permanently(
    eager: None, django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    settings.GRAPHENE_CREATE_ATTEMPTS = 3
    owner = factories.run()
    with django_capture_on_commit_callbacks(execute=True):
        recovers = factories.flaky(owner, "recovers", create_failures=2)
        gives_up = factories.flaky(owner, "gives-up", create_failures=10)
        permanent = factories.flaky(owner, "permanent", create_failures=1, permanent=True)
    assert phases(recovers, gives_up, permanent) == [Phase.READY, Phase.CREATE_FAILED, Phase.CREATE_FAILED]
    assert Event.objects.filter(record=recovers, type=EventType.ERROR).count() == 2
    assert Event.objects.filter(record=gives_up, type=EventType.ERROR).count() == 3
    assert Event.objects.filter(record=permanent, type=EventType.ERROR).count() == 1
    gives_up.refresh_from_db()
    assert "injected create failure" in gives_up.last_error


def test_unknown_kind_and_bad_spec_are_refused_with_field_errors() -> None:
    owner = factories.run()
    with pytest.raises(ValidationFailed) as unknown:
        services.record_declare(kind="no.such", name="x", owner=owner)
    assert "kind" in unknown.value.fields
    with pytest.raises(ValidationFailed) as bad:
        services.record_declare(kind="test.sleep", name="x", owner=owner, spec={"create_ms": -1, "extra": 1})
    assert set(bad.value.fields) == {"spec", "spec.create_ms"}
    assert Record.objects.filter(parent=owner).count() == 0


def test_illegal_transition_is_refused() -> None:
    owner = factories.stand()
    record = Record.objects.get(pk=owner.pk)
    with pytest.raises(services.IllegalTransition):
        transitions._transition([record], Phase.DELETED, reason="skip")
    assert Record.objects.get(pk=owner.pk).phase == Phase.READY


def build_tree(eager_callbacks: Any) -> dict[str, Record]:
    root = factories.run("r")
    with eager_callbacks(execute=True):
        a = factories.sleep(root, "a")
        b = factories.sleep(root, "b")
        a1 = factories.sleep(a, "a1")
        a2 = factories.sleep(a, "a2")
        a1x = factories.sleep(a1, "a1x")
        b1 = factories.sleep(b, "b1")
    return {"root": root, "a": a, "b": b, "a1": a1, "a2": a2, "a1x": a1x, "b1": b1}


def deleted_event_id(record: Record) -> int:
    return Event.objects.get(record=record, type=EventType.PHASE_CHANGED, data__to=Phase.DELETED).pk


def test_cascade_deletes_children_before_parents(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    tree = build_tree(django_capture_on_commit_callbacks)
    check_tree(tree["root"].tree_id)
    with django_capture_on_commit_callbacks(execute=True):
        services.record_delete_request(record=tree["root"])
    assert set(phases(*tree.values())) == {Phase.DELETED}
    for record in tree.values():
        for child in Record.objects.filter(parent=record):
            assert deleted_event_id(child) < deleted_event_id(record), f"{child} must go before {record}"
    for name in ("a", "b", "a1", "a2", "a1x", "b1"):
        assert objects_of(str(tree[name].pk)) == []
        assert phase_events(tree[name])[-2:] == [("ready", "deleting"), ("deleting", "deleted")]


def test_failing_delete_retries_and_is_never_dropped(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    owner = factories.run()
    with django_capture_on_commit_callbacks(execute=True):
        record = factories.flaky(owner, "stubborn", delete_failures=3)
        services.record_delete_request(record=owner)
    record.refresh_from_db()
    assert record.phase == Phase.DELETED
    errors = Event.objects.filter(record=record, type=EventType.ERROR, reason="DeleteFailed")
    assert [e.data["attempt"] for e in errors] == [1, 2, 3]
    assert phase_events(record).count(("deleting", "delete_failed")) == 3
    assert Record.objects.get(pk=owner.pk).phase == Phase.DELETED


def test_owner_waits_while_a_child_delete_keeps_failing(django_capture_on_commit_callbacks: Any) -> None:
    """I6: until the kind confirms, the child stays visible in delete_failed and the owner stays."""
    owner = factories.run()
    with django_capture_on_commit_callbacks(execute=False):
        child = factories.flaky(owner, "stuck", delete_failures=100)
    services.record_converge(record_id=child.pk)
    with django_capture_on_commit_callbacks(execute=False):
        services.record_delete_request(record=owner)
    for _ in range(3):
        with django_capture_on_commit_callbacks(execute=False):
            services.record_delete_batch(record_ids=[str(child.pk)])
    assert phases(child, owner) == [Phase.DELETE_FAILED, Phase.READY]
    child.refresh_from_db()
    assert child.attempts == 3
    assert child.next_attempt_at is not None, "the reconciler must find it again if the retry is lost"
    assert Record.objects.get(pk=owner.pk).deletion_requested_at is not None


def _chain(capture: Any) -> list[Record]:
    """run -> a -> b -> c, all ready, deletion of the run requested (no task run yet)."""
    owner = factories.run()
    chain = [owner]
    with capture(execute=False):
        for name in "abc":
            chain.append(factories.sleep(chain[-1], name))
    for record in chain[1:]:
        services.record_converge(record_id=record.pk)
    with capture(execute=False):
        services.record_delete_request(record=owner)
    return chain


def test_one_task_walks_a_branch_to_its_top(django_capture_on_commit_callbacks: Any) -> None:
    """The task that deletes a parent's last child goes on with the parent: no task per level."""
    chain = _chain(django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=False):
        services.record_delete_batch(record_ids=[str(chain[-1].pk)])
    assert set(phases(*chain)) == {Phase.DELETED}
    assert [objects_of(str(r.pk)) for r in chain[1:]] == [[], [], []]
    deleted = list(Event.objects.filter(type=EventType.PHASE_CHANGED, data__to="deleted").order_by("id"))
    assert [e.record_id for e in deleted] == [r.pk for r in reversed(chain)], "children first"


def test_a_redelivered_batch_goes_on_up_from_records_already_deleted(
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A task killed after deleting its records but before their parent: the redelivered
    message (same ids, all deleted now) finds the parent and finishes the branch."""
    chain = _chain(django_capture_on_commit_callbacks)
    leaf = chain[-1]
    with django_capture_on_commit_callbacks(execute=False):
        with transaction.atomic():
            batch = delete._claim([str(leaf.pk)])
        assert batch is not None
        results = delete._run_deletes(batch.records, batch.wait_for_create)
        with transaction.atomic():
            parents = delete._finish(batch.records, results, timezone.now())
            assert parents == [chain[-2].pk]
            delete._claim(parents)  # the parent is claimed with the leaf's end ... and the task dies here
    assert phases(*chain) == [Phase.READY, Phase.READY, Phase.DELETING, Phase.DELETED]
    assert objects_of(str(chain[-2].pk)) != []
    with django_capture_on_commit_callbacks(execute=False):
        services.record_delete_batch(record_ids=[str(leaf.pk)])
    assert set(phases(*chain)) == {Phase.DELETED}
    assert Event.objects.filter(record=leaf, type=EventType.PHASE_CHANGED, data__to="deleted").count() == 1


def test_a_batch_claims_only_records_whose_deletion_was_requested(django_capture_on_commit_callbacks: Any) -> None:
    """The claim finds its records by primary key and checks the request on the rows it read."""
    owner = factories.run()
    with django_capture_on_commit_callbacks(execute=False):
        going, staying = factories.sleep(owner, "going"), factories.sleep(owner, "staying")
    for record in (going, staying):
        services.record_converge(record_id=record.pk)
    with django_capture_on_commit_callbacks(execute=False):
        services.record_delete_request(record=Record.objects.get(pk=going.pk))
        with transaction.atomic():
            batch = delete._claim([str(going.pk), str(staying.pk)])
    assert batch is not None
    assert [r.pk for r in batch.records] == [going.pk]
    assert phases(going, staying) == [Phase.DELETING, Phase.READY]
    assert delete._ready_parents([staying.pk]) == [], "its deletion was never asked for"


def _claimed_siblings(capture: Any, count: int, **spec: Any) -> list[Record]:
    """``count`` ready siblings under a run whose deletion was requested, claimed (``deleting``)."""
    owner = factories.run()
    with capture(execute=False):
        siblings = [factories.sleep(owner, f"s{i}", **spec) for i in range(count)]
    for record in siblings:
        services.record_converge(record_id=record.pk)
    with capture(execute=False):
        services.record_delete_request(record=owner)
        with transaction.atomic():
            batch = delete._claim([str(r.pk) for r in siblings])
    assert batch is not None
    assert len(batch.records) == count
    return batch.records


def _delete_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads the test kind's deletes run on, from now on."""
    from kinds.testing import SleepKind

    threads: list[str] = []
    real = SleepKind.delete

    def delete_and_tell(self: SleepKind, record: Record) -> None:
        threads.append(threading.current_thread().name)
        real(self, record)

    monkeypatch.setattr(SleepKind, "delete", delete_and_tell)
    return threads


def test_a_batch_of_quick_deletes_stays_on_the_calling_thread(
    django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = _claimed_siblings(django_capture_on_commit_callbacks, 30)
    threads = _delete_threads(monkeypatch)
    # Pool threads join a batch still going after SPREAD_AFTER; a long one keeps a loaded
    # machine's pauses from looking like slow deletes.
    monkeypatch.setattr(delete, "SPREAD_AFTER", 30.0)
    results = delete._run_deletes(records, set())
    assert results == {r.pk: None for r in records}
    assert all(objects_of(str(r.pk)) == [] for r in records)
    assert set(threads) == {threading.current_thread().name}, "no pool thread for deletes that took microseconds"


def test_a_batch_of_slow_deletes_runs_them_side_by_side(
    django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = _claimed_siblings(django_capture_on_commit_callbacks, 6, delete_ms=400)
    threads = _delete_threads(monkeypatch)
    started = time.monotonic()
    results = delete._run_deletes(records, set())
    elapsed = time.monotonic() - started
    assert results == {r.pk: None for r in records}
    assert all(objects_of(str(r.pk)) == [] for r in records)
    # Pool threads join after SPREAD_AFTER: on a quiet machine each delete has a thread of its
    # own (0.4 s in all); one after the other they take 2.4 s.
    assert len(set(threads)) >= 3, threads
    assert elapsed < 1.6, f"six 400 ms deletes took {elapsed:.2f}s"


@pytest.mark.parametrize(
    ("count", "sizes"),
    [(0, []), (1, [1]), (100, [100]), (101, [51, 50]), (200, [100, 100]), (399, [200, 199]), (401, [134, 134, 133])],
)
def test_a_frontier_goes_out_in_even_batches_and_two_once_it_is_over_half_a_batch(
    settings: Any, count: int, sizes: list[int]
) -> None:
    settings.GRAPHENE_DELETE_BATCH = 200
    ids = [f"r{i}" for i in range(count)]
    batches = transitions.deletion_batches(ids)
    assert [len(batch) for batch in batches] == sizes
    assert [pk for batch in batches for pk in batch] == ids, "every id once, in the order given"


def test_declaring_under_an_owner_being_deleted_is_refused(django_capture_on_commit_callbacks: Any) -> None:
    owner = factories.run()
    with django_capture_on_commit_callbacks(execute=False):
        services.record_delete_request(record=owner)
    with pytest.raises(Conflict, match="being deleted"):
        factories.sleep(owner, "late")


def test_ttl_expiry_deletes_the_subtree(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    tree = build_tree(django_capture_on_commit_callbacks)
    soon = timezone.now() + timedelta(seconds=30)
    services.record_set_expiry(record=tree["a"], expires_at=soon)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.records_expire(now=timezone.now()) == 0
        assert services.records_expire(now=soon + timedelta(seconds=1)) == 1
    assert set(phases(tree["a"], tree["a1"], tree["a2"], tree["a1x"])) == {Phase.DELETED}
    assert set(phases(tree["root"], tree["b"], tree["b1"])) == {Phase.READY}
    assert Event.objects.filter(record=tree["a"], type=EventType.EXPIRED).count() == 1
    with django_capture_on_commit_callbacks(execute=True):
        assert services.records_expire(now=soon + timedelta(hours=1)) == 0


def test_extend_and_release(django_capture_on_commit_callbacks: Any) -> None:
    owner = factories.run()
    with django_capture_on_commit_callbacks(execute=False):
        record = factories.sleep(owner, "x")
    record = services.record_extend(record=record, by=timedelta(hours=2))
    assert record.expires_at is not None
    first = record.expires_at
    record = services.record_extend(record=record, by=timedelta(hours=1))
    assert record.expires_at == first + timedelta(hours=1)
    record = services.record_release(record=record)
    assert Record.objects.get(pk=record.pk).expires_at is None
    reasons = list(Event.objects.filter(record=record, type=EventType.TTL_CHANGED).values_list("reason", flat=True))
    assert reasons == ["Extended", "Extended", "Released"]


def test_expiry_lookup_uses_the_partial_index() -> None:
    if connection.vendor != "postgresql":
        pytest.fail("the test suite runs on PostgreSQL")
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        sql, params = (
            Record.objects.filter(expires_at__lte=timezone.now(), deletion_requested_at__isnull=True)
            .order_by("expires_at")[:500]
            .query.sql_with_params()
        )
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("SET enable_seqscan = on")
    assert "record_expiring" in plan, plan


def test_transfer_moves_exactly_the_subtree(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    tree = build_tree(django_capture_on_commit_callbacks)
    keep = factories.stand("keep")
    until = timezone.now() + timedelta(hours=4)
    moved = services.record_transfer(record=tree["a"], new_owner=keep, given_by=tree["root"], expires_at=until)
    assert moved.parent_id == keep.pk
    assert moved.expires_at == until
    in_stand = {r.name for r in Record.objects.get(pk=keep.pk).get_descendants()}
    assert in_stand == {"a", "a1", "a2", "a1x"}
    in_run = {r.name for r in Record.objects.get(pk=tree["root"].pk).get_descendants()}
    assert in_run == {"b", "b1"}
    check_tree(keep.tree_id)
    check_tree(tree["root"].tree_id)
    assert Event.objects.filter(record=keep, type=EventType.TRANSFERRED_IN).count() == 1
    assert Event.objects.filter(record=tree["root"], type=EventType.TRANSFERRED_OUT).count() == 1
    # The run dies: what it still owns goes, what it gave away stays.
    with django_capture_on_commit_callbacks(execute=True):
        services.record_delete_request(record=Record.objects.get(pk=tree["root"].pk))
    assert set(phases(tree["b"], tree["b1"], tree["root"])) == {Phase.DELETED}
    assert set(phases(tree["a"], tree["a1"], tree["a2"], tree["a1x"])) == {Phase.READY}


def test_transfer_refuses_cycles_roots_and_taking(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    tree = build_tree(django_capture_on_commit_callbacks)
    with pytest.raises(ValidationFailed, match="own its own ancestor"):
        services.record_transfer(record=tree["a"], new_owner=tree["a1x"])
    with pytest.raises(ValidationFailed, match="own its own ancestor"):
        services.record_transfer(record=tree["a"], new_owner=tree["a"])
    with pytest.raises(ValidationFailed, match="roots"):
        services.record_transfer(record=tree["root"], new_owner=tree["b"])
    with pytest.raises(Conflict, match="given by the current owner"):
        services.record_transfer(record=tree["a1"], new_owner=tree["b"], given_by=tree["root"])
    assert Record.objects.get(pk=tree["a"].pk).parent_id == tree["root"].pk
    check_tree(tree["root"].tree_id)


def test_roots_are_separate_trees() -> None:
    first, second = factories.run("one"), factories.stand("two")
    assert first.tree_id != second.tree_id
    with pytest.raises(Conflict):
        factories.stand("two")


def test_sweeper_deletes_orphans_and_reports_them(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    owner = factories.run()
    with django_capture_on_commit_callbacks(execute=True):
        live = factories.sleep(owner, "live")
        gone = factories.sleep(owner, "gone")
    # An object whose record was deleted without its delete reaching the outside, and a
    # marked object no record ever knew (e.g. its tombstone was purged long ago).
    Record.objects.filter(pk=gone.pk).update(phase=Phase.DELETED, deleted_at=timezone.now())
    stranger = Path(settings.GRAPHENE_TEST_WORLD_DIR) / "test.sleep" / "6f1c1d8e-0000-4000-8000-000000000000"
    stranger.mkdir(parents=True)
    (stranger / "obj").write_text("x")

    dry = services.records_sweep(dry_run=True)
    assert {f["record_id"] for f in dry} >= {str(gone.pk), stranger.name}
    assert objects_of(str(gone.pk)), "a dry run deletes nothing"

    found = services.records_sweep()
    by_record = {f["record_id"]: f for f in found if f["kind"] == "test.sleep"}
    assert by_record[str(gone.pk)]["record"] == "deleted"
    assert by_record[stranger.name]["record"] == "unknown"
    assert str(live.pk) not in by_record
    assert objects_of(str(gone.pk)) == []
    assert not stranger.exists()
    assert len(objects_of(str(live.pk))) == 1
    sweeper = Record.objects.get(kind="graphene.sweeper")
    assert Event.objects.filter(record=sweeper, type=EventType.ORPHAN_DELETED).count() >= 2


def test_file_kind_creates_marks_and_deletes(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    owner = factories.run()
    with django_capture_on_commit_callbacks(execute=True):
        record = services.record_declare(
            kind="file", name="cfg", owner=owner, spec={"path": "svc/app.conf", "content": "port=80\n", "mode": 0o600}
        )
    record.refresh_from_db()
    path = Path(record.outputs["path"])
    assert record.phase == Phase.READY
    assert path.read_text() == "port=80\n"
    assert path.stat().st_mode & 0o777 == 0o600
    from kinds.file import read_marker

    assert read_marker(path) == str(record.pk)
    with django_capture_on_commit_callbacks(execute=True):
        services.record_delete_request(record=owner)
    assert not path.exists()


def test_file_kind_never_adopts_a_strangers_file(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    target = Path(settings.GRAPHENE_FILE_ROOT) / "theirs.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("not yours")
    owner = factories.run()
    with django_capture_on_commit_callbacks(execute=True):
        record = services.record_declare(
            kind="file", name="f", owner=owner, spec={"path": "theirs.txt", "content": "x"}
        )
        escape = services.record_declare(
            kind="file", name="g", owner=owner, spec={"path": "../../etc/x", "content": "x"}
        )
    assert phases(record, escape) == [Phase.CREATE_FAILED, Phase.CREATE_FAILED]
    assert "refusing to adopt" in Record.objects.get(pk=record.pk).last_error
    assert "outside the file root" in Record.objects.get(pk=escape.pk).last_error
    with django_capture_on_commit_callbacks(execute=True):
        services.record_delete_request(record=owner)
    assert target.read_text() == "not yours"


def test_purge_removes_old_tombstones_whole_subtrees(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    tree = build_tree(django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        services.record_delete_request(record=tree["a"])
    assert services.records_purge(now=timezone.now()) == 0, "within retention nothing is purged"
    later = timezone.now() + settings.GRAPHENE_TOMBSTONE_RETENTION + timedelta(minutes=1)
    assert services.records_purge(now=later) == 4
    assert not Record.objects.filter(pk__in=[tree[n].pk for n in ("a", "a1", "a2", "a1x")]).exists()
    assert not Event.objects.filter(record_id=tree["a"].pk).exists()
    assert set(phases(tree["root"], tree["b"], tree["b1"])) == {Phase.READY}
    check_tree(tree["root"].tree_id)


def test_nested_declarations_transfers_deletes_and_purges_keep_the_tree_valid(
    eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    """Declarations placed without moving other rows (on the tree's right edge) and with moving
    them (under an earlier branch), transfers in and out, deletion and purge: after each, the
    nested sets are exact and each declared record knows its own bounds."""
    run = factories.run()

    def declare(owner: Record, name: str) -> Record:
        with django_capture_on_commit_callbacks(execute=False):
            record = factories.sleep(owner, name)
        stored = Record.objects.get(pk=record.pk)
        assert (record.lft, record.rght, record.tree_id, record.level) == (
            stored.lft,
            stored.rght,
            stored.tree_id,
            stored.level,
        )
        return record

    branches = [declare(run, f"b{i}") for i in range(3)]
    for round_ in range(3):  # round-robin: all but the last branch are left of the right edge
        for i, branch in enumerate(branches):
            child = declare(branch, f"c{round_}")
            declare(child, "leaf")
            check_tree(run.tree_id)
            assert Record.objects.get(pk=branch.pk).descendants_counted() == 2 * (round_ + 1), i
    stand = factories.stand("keep")
    declare(stand, "mine")
    services.record_transfer(record=branches[1], new_owner=stand, given_by=run)
    check_tree(run.tree_id)
    check_tree(stand.tree_id)
    declare(Record.objects.get(pk=branches[1].pk), "after-transfer")  # owner now in the stand's tree
    check_tree(stand.tree_id)
    # The subtree landed after the stand's free numbers: a new holding must not land on it.
    declare(Record.objects.get(pk=stand.pk), "after-transfer-too")
    check_tree(stand.tree_id)
    assert Record.objects.get(pk=stand.pk).descendants_counted() == 10  # mine, b1 and its 6, and the two after
    with django_capture_on_commit_callbacks(execute=True):
        services.record_delete_request(record=Record.objects.get(pk=branches[0].pk))
    later = timezone.now() + settings.GRAPHENE_TOMBSTONE_RETENTION + timedelta(minutes=1)
    assert services.records_purge(now=later) == 7
    check_tree(run.tree_id)
    declare(Record.objects.get(pk=branches[2].pk), "after-purge")
    declare(run, "last")
    check_tree(run.tree_id)
    names = {r.name for r in Record.objects.get(pk=run.pk).get_descendants()}
    assert names == {"b2", "c0", "c1", "c2", "leaf", "after-purge", "last"}


def test_an_owner_declared_into_again_and_again_moves_the_rest_of_its_tree_a_few_times(
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Free numbers: an owner that runs out grows by its own width, so the records to its right
    move about log2(children) times, not once per child; the tree stays exact throughout."""
    run = factories.run()
    with django_capture_on_commit_callbacks(execute=False):
        left, middle, right = (factories.sleep(run, name) for name in ("left", "middle", "right"))
        positions = [Record.objects.get(pk=right.pk).lft]
        for i in range(60):  # round-robin into the two owners left of the right edge
            factories.sleep(left if i % 2 else middle, f"c{i}")
            positions.append(Record.objects.get(pk=right.pk).lft)
    check_tree(run.tree_id)
    moves = sum(1 for before, after in itertools.pairwise(positions) if before != after)
    assert 1 <= moves <= 6, f"the record right of them moved {moves} times in 60 declarations"
    assert [Record.objects.get(pk=r.pk).descendants_counted() for r in (left, middle, right)] == [30, 30, 0]
    assert Record.objects.get(pk=right.pk).is_leaf_node()
    assert not Record.objects.get(pk=left.pk).is_leaf_node()


def test_a_declaration_is_two_statements_flat_or_nested(django_capture_on_commit_callbacks: Any) -> None:
    """The tree's lock and one statement (bounds, record, event, audit row), whether or not
    other records of the tree move (bench/records_insert.py measures the time)."""
    run = factories.run()
    with django_capture_on_commit_callbacks(execute=False):
        first, second = factories.sleep(run, "first"), factories.sleep(run, "second")
        for owner, name in ((run, "flat"), (first, "nested"), (second, "on-the-edge")):
            with CaptureQueriesContext(connection) as queries:
                factories.sleep(owner, name)
            statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
            assert len(statements) == 2, (name, statements)
    check_tree(run.tree_id)
    assert AuditEntry.objects.filter(action="record.create").count() == 5
    assert Event.objects.filter(record__tree_id=run.tree_id, type=EventType.DECLARED, reason="Declared").count() == 5


def test_a_declarations_statements_are_prepared_once_per_connection(
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The tree's lock and the insert are planned once per database session, then executed
    from the plan (Django opens its connections with psycopg's preparation off)."""
    run = factories.run()
    with django_capture_on_commit_callbacks(execute=False):
        for i in range(4):
            factories.sleep(run, f"r{i}")
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements")
        prepared = cursor.fetchall()
    lock = [uses for statement, uses in prepared if '"parent_id" IS NULL FOR NO KEY UPDATE' in statement]
    insert = [uses for statement, uses in prepared if "INSERT INTO records_record" in statement]
    assert [len(lock), len(insert)] == [1, 1], prepared
    assert min(lock + insert) >= 4, prepared


def test_a_declarations_insert_is_short_enough_for_psycopg_to_keep_its_parse(
    django_capture_on_commit_callbacks: Any,
) -> None:
    """psycopg parses a statement's placeholders again at each execution when it is longer than
    ``MAX_CACHED_STATEMENT_LENGTH`` (4 KiB): for the declaration's insert that cost 25-35 us of
    each declaration. A column added to records, events or audit rows may lengthen it past that;
    then shorten it (``_insert_child_sql``)."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    run = factories.run()
    with django_capture_on_commit_callbacks(execute=False), CaptureQueriesContext(connection) as queries:
        factories.sleep(run, "r")
    (insert,) = [q["sql"] for q in queries.captured_queries if "INSERT INTO records_record" in q["sql"]]
    assert len(insert) <= MAX_CACHED_STATEMENT_LENGTH, len(insert)


def test_a_deletion_request_of_a_root_is_two_statements(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    """The root locked and read, then one statement marks the subtree, writes the event and
    the audit row with the count, and returns the frontier; the deletion it sends completes,
    children first."""
    run = factories.run()
    with django_capture_on_commit_callbacks(execute=True):
        branch = factories.sleep(run, "branch")
        for i in range(3):
            factories.sleep(branch, f"leaf{i}")
    with django_capture_on_commit_callbacks(execute=False) as callbacks, CaptureQueriesContext(connection) as queries:
        services.root_delete_request(root_id=run.pk, reason="RunSucceeded")
    statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(statements) == 2, statements
    assert not Record.objects.filter(tree_id=run.tree_id, deletion_requested_at__isnull=True).exists()
    event = Event.objects.get(record_id=run.pk, type=EventType.DELETION_REQUESTED)
    assert (event.reason, event.data) == ("RunSucceeded", {"subtree_records": 5})
    audit = AuditEntry.objects.get(action="record.delete_request", object_id=str(run.pk))
    assert audit.detail == {"reason": "RunSucceeded", "subtree": 5}
    for callback in callbacks:
        callback()
    assert set(Record.objects.filter(tree_id=run.tree_id).values_list("phase", flat=True)) == {Phase.DELETED}
    deleted = {r.name: r.deleted_at or timezone.now() for r in Record.objects.filter(tree_id=run.tree_id)}
    assert all(r.deleted_at is not None for r in Record.objects.filter(tree_id=run.tree_id))
    assert all(deleted[f"leaf{i}"] <= deleted["branch"] for i in range(3))
    assert deleted["branch"] <= deleted[run.name]
