"""What the records' services lock, and what their threads leave behind: the delete pool's
threads close the database sessions their deletes opened."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from apps.records import services
from apps.records.choices import Phase
from apps.records.models import Record
from kinds.testing import SleepKind
from tests import factories
from tests.conftest import wait_for


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _sessions(pids: set[int]) -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [list(pids)])
        return {row[0] for row in cursor.fetchall()}


def _waits_for_a_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
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
        children = [factories.sleep(owner, f"c{i}") for i in range(8)]
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
    assert all(name.startswith("graphene-delete") for name, _ in seen), "the siblings were deleted on the pool"
    pids = {pid for _, pid in seen}
    assert _backend_pid() not in pids
    wait_for(lambda: not _sessions(pids), what="the pool threads' database sessions to end")
