"""What the records' services lock, and what their threads leave behind: a transfer locks the
row it moves (after the trees' roots) and the trees it is in when it moves it; the delete
pool's threads close the database sessions their deletes opened."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from apps.records import services
from apps.records.choices import Phase
from apps.records.models import Record
from kinds.testing import SleepKind
from tests import factories
from tests.conftest import wait_for
from tests.records.test_services import check_tree


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _sessions(pids: set[int]) -> set[int]:
    with connection.cursor() as cursor:
        # PostgreSQL keeps one snapshot of the backends' status per transaction (the test's):
        # drop it, or every poll after the first would see the sessions as they were then.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [list(pids)])
        return {row[0] for row in cursor.fetchall()}


def _waits_for_a_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # see _sessions
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return row is not None and row[0] == "Lock"


# --- the delete pool ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_delete_pools_threads_leave_no_database_session_open(
    eager: None, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = factories.run()
    with django_capture_on_commit_callbacks(execute=True):
        # Slow enough for pool threads to join the calling thread (``SPREAD_AFTER``).
        children = [factories.sleep(owner, f"c{i}", delete_ms=200) for i in range(8)]
    seen: list[tuple[str, int]] = []
    delete = SleepKind.delete

    def delete_using_the_database(self: SleepKind, record: Record) -> None:
        seen.append((threading.current_thread().name, _backend_pid()))  # as a kind writing a log line would
        delete(self, record)

    monkeypatch.setattr(SleepKind, "delete", delete_using_the_database)
    with django_capture_on_commit_callbacks(execute=True):
        services.record_delete_request(record=owner)

    assert {Record.objects.get(pk=r.pk).phase for r in [*children, owner]} == {Phase.DELETED}
    assert len(seen) == len(children)
    pooled = [(name, pid) for name, pid in seen if name.startswith("graphene-delete")]
    assert len(pooled) >= len(children) // 2, f"the siblings were deleted on the pool: {seen}"
    pids = {pid for _, pid in pooled}
    assert _backend_pid() not in pids
    wait_for(lambda: not _sessions(pids), what="the pool threads' database sessions to end")


# --- transfer ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_transfer_locks_the_row_it_moves_after_the_trees_roots(
    eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    run = factories.run()
    with django_capture_on_commit_callbacks(execute=True):
        record = factories.sleep(run, "moved")
    stand = factories.stand("keep")
    with CaptureQueriesContext(connection) as queries:
        services.record_transfer(record=record, new_owner=stand)
    statements = [q["sql"] for q in queries.captured_queries]
    locks = [i for i, sql in enumerate(statements) if "FOR NO KEY UPDATE" in sql]
    writes = [i for i, sql in enumerate(statements) if sql.lstrip().upper().startswith("UPDATE")]
    roots = [i for i in locks if '"parent_id" IS NULL' in statements[i]]
    row = [i for i in locks if record.pk.hex in statements[i] and i not in roots]
    assert len(roots) == 2, statements
    assert len(row) == 1, statements
    assert max(roots) < row[0] < min(writes), "roots first, then the moved row, then the move"
    assert Record.objects.get(pk=record.pk).parent_id == stand.pk


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """``fn`` on a thread of its own (its own database session, closed at the end)."""
    out: dict[str, Any] = {}

    def body() -> None:
        out["pid"] = _backend_pid()
        try:
            out["result"] = fn()
        except BaseException as exc:
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread, out


@pytest.mark.django_db(transaction=True)
def test_a_transfer_locks_the_tree_the_record_is_in_when_it_moves_it(eager: None) -> None:
    """The caller's copy of the record was read before another transfer took it to another
    tree: the move must lock that tree, not the one the copy names, or it shifts the tree's
    nodes while another change to the same tree is under way, and corrupts it."""
    run, first, second, third = (
        factories.run(),
        factories.stand("first"),
        factories.stand("second"),
        factories.stand("third"),
    )
    before, moved = factories.sleep(run, "before"), factories.sleep(run, "moved")
    stale = Record.objects.get(pk=moved.pk)  # read while it is in the run's tree
    services.record_transfer(record=before, new_owner=first)
    services.record_transfer(record=moved, new_owner=first)  # now in first's tree, after ``before``

    changing, done = threading.Event(), threading.Event()

    def change_the_first_tree() -> None:
        with transaction.atomic():  # held open: ``before`` leaves, ``moved`` shifts left
            services.record_transfer(record=Record.objects.get(pk=before.pk), new_owner=third)
            changing.set()
            done.wait(timeout=60)

    changer, _ = _in_thread(change_the_first_tree)
    assert changing.wait(timeout=30)
    mover, out = _in_thread(lambda: services.record_transfer(record=stale, new_owner=second))
    try:
        wait_for(lambda: "pid" in out and _waits_for_a_lock(out["pid"]), what="the transfer to wait for the change")
    finally:
        done.set()
        changer.join(timeout=60)
        mover.join(timeout=60)
    assert "error" not in out, out.get("error")
    assert Record.objects.get(pk=moved.pk).parent_id == second.pk
    assert Record.objects.get(pk=before.pk).parent_id == third.pk
    for root in (run, first, second, third):
        check_tree(Record.objects.get(pk=root.pk).tree_id)
