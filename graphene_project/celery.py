"""The Celery application. Tasks live in ``apps/<app>/tasks.py`` and carry only ids."""

import math
import os
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.signals import (
    task_postrun,
    task_prerun,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "graphene_project.settings.dev")

app = Celery("graphene")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# A connection that ended a task less than this ago skips Django's health check (a round trip
# before the next task's first query), as PgBouncer skips its check of a server connection used
# within server_check_delay. One that breaks within that second fails the task that uses it, as
# a connection breaking in the middle of a task does, and its error retires it after the task.
HEALTHY_FOR_SECONDS = 1.0
_task_ended: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def _idle_connections() -> Iterator["BaseDatabaseWrapper"]:
    """What Django does around each request (signal receivers justify themselves here: Celery
    offers no other hook around every task): drop connections that are broken or older than
    CONN_MAX_AGE, since Celery no longer closes them after each task (CELERY_DB_REUSE_MAX).
    The open connections left, outside a transaction."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        # Inside a transaction (an eagerly run task in a test, a task called from a service)
        # the connection is in use: leave it alone.
        if conn.in_atomic_block:
            continue
        conn.close_if_unusable_or_obsolete()
        if conn.connection is not None:
            yield conn


@task_prerun.connect
def _connections_before_task(**_: object) -> None:
    now = time.monotonic()
    for conn in _idle_connections():
        if now - _task_ended.get(conn, -math.inf) < HEALTHY_FOR_SECONDS:
            conn.health_check_done = True  # type: ignore[attr-defined]  # Django's own flag: checked already


@task_postrun.connect
def _connections_after_task(**_: object) -> None:
    now = time.monotonic()
    for conn in _idle_connections():
        _task_ended[conn] = now


# The audit context of each task: task id -> the token that restores the one before.
_audit_tokens: dict[str, Any] = {}


@task_prerun.connect
def _audit_as_system(task_id: str = "", task: Any = None, **_: object) -> None:
    """Rows a task's writes leave without an explicit actor are the system's, named after the
    task (``records_expire_task``): beat's periodic tasks, the reconciler, convergence. The
    engine names the run instead while it executes a run's code. A signal receiver, because
    Celery offers no other hook around every task."""
    from apps.core import audit

    name = str(getattr(task, "name", "") or "").rpartition(".")[2]
    _audit_tokens[task_id] = audit.enter(audit.who_system(name or audit.SYSTEM_NAME))


@task_postrun.connect
def _audit_context_end(task_id: str = "", **_: object) -> None:
    from apps.core import audit

    token = _audit_tokens.pop(task_id, None)
    if token is not None:
        audit.leave(token)


@worker_process_init.connect
def _heartbeat_in_pool_child(**_: object) -> None:
    """A prefork pool child executes tasks: it proves itself alive (apps/core/workers.py).
    Celery offers no other hook in the child than this signal."""
    from apps.core import workers

    workers.heartbeat_start()


@worker_ready.connect
def _heartbeat_in_worker(sender: Any = None, **_: object) -> None:
    """A worker whose pool runs tasks in its own process (threads, solo) proves that process
    alive; a prefork worker's children do so themselves."""
    from celery.concurrency.prefork import TaskPool

    from apps.core import workers

    pool_cls = getattr(getattr(sender, "controller", None), "pool_cls", None)
    if not (isinstance(pool_cls, type) and issubclass(pool_cls, TaskPool)):
        workers.heartbeat_start()


@worker_process_shutdown.connect
@worker_shutdown.connect
def _heartbeat_end(**_: object) -> None:
    """A clean exit: the process's heartbeat row goes (it holds nothing any more)."""
    from apps.core import workers

    workers.heartbeat_stop()
