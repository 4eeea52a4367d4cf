"""The Celery application. Tasks live in ``apps/<app>/tasks.py`` and carry only ids."""

import math
import os
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import celery
from celery import Celery, signals
from celery.signals import (
    task_postrun,
    task_prerun,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from celery.utils import uuid
from kombu import serialization
from kombu.exceptions import OperationalError
from kombu.transport.virtual.base import Base64
from kombu.utils.json import dumps as json_dumps

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "graphene_project.settings.dev")


class Task(celery.Task[Any, Any]):
    """The base of Graphene's tasks (``app.Task``).

    A send with positional arguments and at most a countdown, of a task without options of its
    own (``_plain``), to a Redis broker, is Celery's own message (``amqp.create_task_message``)
    pushed onto the queue's list with one LPUSH, as kombu's Redis transport pushes it
    (``_Direct``), after the same check of the arguments against the task's signature.
    ``apply_async`` spends about 0.4 ms more on that message: settings looked up through
    Django's on each send, a producer from the pool, the queue's declaration checked, and a new
    Redis client for each message in kombu's Redis transport. That is a fifth of a record's
    declaration or of a run's start, each of which sends one. Any other send, an eager one
    (tests), or one that a publish signal's receiver watches goes through ``apply_async`` as it
    is."""

    def apply_async(
        self,
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> Any:
        direct = None
        if self._plain() and not (
            kwargs or task_id or producer or link or link_error or shadow or options.keys() - {"countdown"}
        ):
            direct = _direct(self.app)
        if (
            direct is None
            or self.app.conf.task_always_eager
            or signals.before_task_publish.receivers
            or signals.after_task_publish.receivers
        ):
            return super().apply_async(args, kwargs, task_id, producer, link, link_error, shadow, **options)
        args = tuple(args or ())
        if self.typing:  # as apply_async: arguments the task cannot take are a TypeError here
            self.__header__(*args)  # type: ignore[attr-defined]  # Celery's, not in its stubs
        return direct.send(self, args, options.get("countdown"))

    def _plain(self) -> bool:
        """Whether the task's own options leave its message as plain as the direct send makes
        it: no queue, routing, priority, serializer, compression or time limits of its own, no
        pydantic arguments, no shadow name."""
        options = self._get_exec_options()  # type: ignore[attr-defined]  # Celery's, not in its stubs
        return (
            options.get("serializer") in (None, "json")
            and not any(value for name, value in options.items() if name != "serializer")
            and getattr(self, "_dump_pydantic_arguments", None) is None
            and not self.__v2_compat__
            and type(self).shadow_name is celery.Task.shadow_name
        )


class _Direct:
    """Sends a task's message straight to a Redis broker's queue (``Task.apply_async``).

    The message is the one ``apply_async`` sends: Celery's protocol-2 headers, properties and
    body for the task, in the envelope of kombu's Redis transport (the body JSON then base64,
    the delivery info of the default direct exchange, priority 0: the queue's own list). One
    client per process, whose connection pool serves every thread; a failed push is retried
    ``task_publish_retry_policy``'s ``max_retries`` times, ``interval_step`` apart (none when
    ``task_publish_retry`` is off), and then raised as kombu's ``OperationalError``, which is
    what ``apply_async`` raises."""

    def __init__(self, app: Celery) -> None:
        import redis  # here, not at the top: redis-py imports OpenTelemetry, which nothing else may need

        conf = app.conf
        policy = conf.task_publish_retry_policy or {}
        self.queue = conf.task_default_queue
        self.client = redis.Redis.from_url(
            conf.broker_url,
            socket_connect_timeout=conf.broker_connection_timeout,
            socket_timeout=conf.broker_connection_timeout,
            retry=redis.retry.Retry(
                redis.backoff.ConstantBackoff(policy.get("interval_step", 0.2)),
                policy.get("max_retries", 3) if conf.task_publish_retry else 0,
            ),
        )
        self.redis_error: type[Exception] = redis.RedisError
        self.delivery_info = {"exchange": "", "routing_key": self.queue}
        self.base64 = Base64()

    def send(self, task: Task, args: tuple[Any, ...], countdown: float | None) -> Any:
        app, task_id = task.app, uuid()
        root_id = parent_id = None
        parent = app.current_worker_task
        if parent:  # as send_task: the message names the task that sent it
            root_id = parent.request.root_id or parent.request.id
            parent_id = parent.request.id
        headers, properties, body, _sent_event = app.amqp.create_task_message(
            task_id,
            task.name,
            args,
            {},
            countdown,
            reply_to=app.thread_oid,
            root_id=root_id,
            parent_id=parent_id,
            ignore_result=task.ignore_result,
        )
        content_type, content_encoding, data = serialization.dumps(body, "json")
        properties.update(
            delivery_mode=2,
            delivery_info=dict(self.delivery_info),
            priority=0,
            body_encoding="base64",
            delivery_tag=uuid(),
        )
        envelope = {
            "body": self.base64.encode(data),
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": headers,
            "properties": properties,
        }
        try:
            self.client.lpush(self.queue, json_dumps(envelope))
        except self.redis_error as exc:
            raise OperationalError(f"could not send {task.name} to {self.queue}: {exc}") from exc
        return task.AsyncResult(task_id)


_direct_lock = threading.Lock()
_direct_by_app: weakref.WeakKeyDictionary[Celery, _Direct | None] = weakref.WeakKeyDictionary()


def _direct(app: Celery) -> _Direct | None:
    """The direct sender for ``app``, or None where its message or its way would differ from
    ``apply_async``'s: a broker that is not plain Redis (or is reached over TLS), routes or
    queues of one's own, another serializer, compression, priorities, delivery mode, protocol or
    key prefix. Decided once per process."""
    if app not in _direct_by_app:
        with _direct_lock:
            if app not in _direct_by_app:
                conf = app.conf
                plain = (
                    urlsplit(str(conf.broker_url or "")).scheme == "redis"
                    and not conf.broker_use_ssl
                    and not conf.task_routes
                    and conf.task_queues is None
                    and conf.task_serializer == "json"
                    and conf.task_compression is None
                    and conf.task_protocol == 2
                    and conf.task_default_priority is None
                    and conf.task_default_delivery_mode in ("persistent", 2)
                    and conf.task_default_exchange_type == "direct"
                    and not conf.task_send_sent_event
                    and not (conf.broker_transport_options or {}).get("global_keyprefix")
                )
                _direct_by_app[app] = _Direct(app) if plain else None
    return _direct_by_app[app]


app: Celery = Celery("graphene", task_cls=Task)  # its tasks are Celery's, and ours
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
