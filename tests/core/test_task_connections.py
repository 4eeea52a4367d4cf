"""Database connections around Celery tasks (graphene_project/celery.py): a connection that
ended a task within ``HEALTHY_FOR_SECONDS`` goes into the next task without Django's health
check (a round trip); one idle for longer is checked first, and a broken one is replaced."""

from __future__ import annotations

import pytest
from django.db import connection, connections

from graphene_project import celery as celery_app

pytestmark = pytest.mark.django_db(transaction=True)


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _terminate(pid: int) -> None:
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()


def test_a_connection_that_just_ended_a_task_goes_into_the_next_unchecked() -> None:
    pid = _backend_pid()
    celery_app._connections_after_task()
    celery_app._connections_before_task()
    assert connection.health_check_done, "no check: the connection ended a task a moment ago"  # type: ignore[attr-defined]
    assert _backend_pid() == pid


def test_a_connection_idle_longer_is_checked_and_a_broken_one_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(celery_app, "HEALTHY_FOR_SECONDS", 0.0)
    pid = _backend_pid()
    celery_app._connections_after_task()
    _terminate(pid)  # the server ends the session while the worker waits for its next task
    celery_app._connections_before_task()
    assert not connection.health_check_done  # type: ignore[attr-defined]  # Django's own flag
    assert _backend_pid() != pid, "the check found the session gone and the task got a new one"
