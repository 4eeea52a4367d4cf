"""``apps.core.db``: the advisory locks on PostgreSQL, their stand-in on SQLite (a bounded
table of process-local locks), and pool threads that close their connections."""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection, transaction

from apps.core import db
from apps.core.db import LocalLocks
from tests.conftest import wait_for


def _in_other_session(sql: str, params: list[Any]) -> Any:
    """One value from ``sql`` run on another thread (so another database session), which is then closed."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(db.closes_connections(_fetch_one), sql, params).result(timeout=30)


def _fetch_one(sql: str, params: list[Any]) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def _sessions(pids: set[int]) -> set[int]:
    """Those of ``pids`` whose database session is still open."""
    with connection.cursor() as cursor:
        # PostgreSQL keeps one snapshot of the backends' status per transaction (the test's):
        # drop it, or every poll after the first would see the sessions as they were then.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [list(pids)])
        return {row[0] for row in cursor.fetchall()}


# --- the process-local table (SQLite) ----------------------------------------------------------


def test_the_local_table_keeps_no_entry_for_a_key_nobody_holds() -> None:
    table = LocalLocks()
    for key in range(10_000):  # one record id after another, as operation_lock sees them
        with table.hold(key):
            assert len(table) == 1
    assert len(table) == 0


def test_a_local_lock_excludes_and_its_entry_goes_with_the_last_waiter() -> None:
    table = LocalLocks()
    holding, release, entered = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with table.hold(7):
            holding.set()
            release.wait(timeout=30)

    def second() -> None:
        with table.hold(7):
            entered.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert holding.wait(timeout=30)
    threads[1].start()
    # The second thread is counted in the entry, waiting: one entry, two users, not inside.
    wait_for(lambda: table._entries[7].users == 2, what="the second thread to wait for the key")
    assert len(table) == 1
    assert not entered.is_set()
    release.set()
    for thread in threads:
        thread.join(timeout=30)
    assert entered.is_set()
    assert len(table) == 0


def test_local_locks_under_contention_exclude_per_key_and_leave_the_table_empty() -> None:
    table = LocalLocks()
    inside: Counter[int] = Counter()
    most: Counter[int] = Counter()
    count_guard = threading.Lock()

    def work(worker: int) -> None:
        for i in range(2_000):
            key = i % 5 if i % 2 else 1_000 * worker + i  # shared keys and keys of its own
            with table.hold(key):
                with count_guard:
                    inside[key] += 1
                    most[key] = max(most[key], inside[key])
                with count_guard:
                    inside[key] -= 1

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert set(most.values()) == {1}, "two threads were inside one key's lock at once"
    assert len(table) == 0


def test_a_local_lock_is_reentrant_like_a_session_lock() -> None:
    table = LocalLocks()
    with table.hold(3), table.hold(3):
        assert len(table) == 1
    assert len(table) == 0


@pytest.mark.django_db
def test_on_sqlite_the_operation_lock_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.records.services import operation_lock

    monkeypatch.setattr(db, "is_postgresql", lambda using="default": False)
    for n in range(1_000):
        with operation_lock(f"00000000-0000-0000-0000-{n:012d}"):
            assert len(db.local_locks) == 1
    assert len(db.local_locks) == 0


# --- PostgreSQL --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_advisory_lock_is_held_for_the_block_across_transactions() -> None:
    key = db.lock_key("tests.core.session")
    with db.advisory_lock(key):
        with transaction.atomic():
            pass  # a transaction ending does not release it
        assert _in_other_session("SELECT pg_try_advisory_lock(%s)", [key]) is False
    assert _in_other_session("SELECT pg_try_advisory_lock(%s)", [key]) is True
    assert len(db.local_locks) == 0  # PostgreSQL's, not the process-local stand-in


@pytest.mark.django_db(transaction=True)
def test_an_advisory_transaction_lock_is_held_to_the_commit() -> None:
    key = db.lock_key("tests.core.xact")
    with pytest.raises(RuntimeError, match="open transaction"):
        db.advisory_xact_lock(key)
    with transaction.atomic():
        db.advisory_xact_lock(key)
        assert _in_other_session("SELECT pg_try_advisory_xact_lock(%s)", [key]) is False
    assert _in_other_session("SELECT pg_try_advisory_xact_lock(%s)", [key]) is True


def test_lock_keys_are_stable_signed_64_bit_integers() -> None:
    # The keys are shared by every process of an installation, old and new: they must not change.
    assert db.lock_key("graphene") == db.lock_key("graphene")
    assert db.lock_key("artifact:x") != db.lock_key("artifact:y")
    assert all(-(2**63) <= db.lock_key(str(n)) < 2**63 for n in range(1_000))
    assert db.lock_key("0") == int.from_bytes(hashlib.blake2b(b"0", digest_size=8).digest(), "big", signed=True)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


@pytest.mark.django_db
def test_a_pool_thread_closes_the_connections_its_work_opened(pool: ThreadPoolExecutor) -> None:
    together = threading.Barrier(4, timeout=30)

    def backend_pid(_: int) -> int:
        together.wait()  # every thread of the pool at work at once: four sessions
        return int(_fetch_one("SELECT pg_backend_pid()", []))

    pids = set(pool.map(db.closes_connections(backend_pid), range(4)))
    assert len(pids) == 4
    wait_for(lambda: not _sessions(pids), what="the pool threads' sessions to end")
