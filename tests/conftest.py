"""Shared fixtures: worker processes and web servers (own or the session's), the in-process
driver, API clients. The helpers themselves live in ``tests/harness/``."""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient
from selenium.webdriver.remote.webdriver import WebDriver

from tests import factories
from tests.harness.browser import chromium_driver
from tests.harness.driver import Driver
from tests.harness.embedded import Ctl, Server
from tests.harness.processes import (
    REPO,
    SharedWorkers,
    Worker,
    process_env,
    purge_queue,
    running_beat,
)
from tests.harness.wait import wait_for
from tests.harness.web import CHANNEL_LAYER_URL, WebServer

__all__ = ["REPO", "Worker", "process_env", "purge_queue", "running_beat", "wait_for"]


def _commits(item: pytest.Item) -> bool:
    marker = item.get_closest_marker("django_db")
    transaction = marker is not None and bool(marker.kwargs.get("transaction") or marker.args[:1] == (True,))
    return transaction or "transactional_db" in getattr(item, "fixturenames", ())


def _group(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker and marker.args else ""


def _xdist_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--dist loadgroup`` for pytest 9: pytest-xdist 3.8 marks a grouped test by appending
    ``@<group>`` to the item's ``_nodeid``, which pytest 9 no longer reads (the id lives in
    ``_id``), so every test would be a group of its own. This appends it where pytest reads it,
    as xdist does, and does nothing once xdist's own suffix shows."""
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import NodeId

    for item in items:
        names = sorted(
            {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
        )
        suffix = f"@{'_'.join(names)}"
        if names and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)  # private, as xdist's own: see the docstring


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """What holds one xdist process longest starts first, so that under xdist it runs beside the
    rest instead of alone at the end: the CLI tests' embedded server (no database: they may go
    anywhere) at the very front; the crash test, then the modules that share a pool, first of the
    tests that commit (pytest-django keeps those after the ones that roll back)."""
    front = [item for item in items if _group(item) == "graphene-up"]
    rest = [item for item in items if _group(item) != "graphene-up"]
    at = next((n for n, item in enumerate(rest) if _commits(item)), len(rest))
    committing = sorted(rest[at:], key=lambda item: 0 if item.get_closest_marker("chaos") else 1 if _group(item) else 2)
    items[:] = front + rest[:at] + committing
    _xdist_groups(config, items)


@pytest.fixture(autouse=True)
def _empty_cache() -> None:
    """Each test starts with this process's cache empty (in memory, settings/test.py): the
    failed authentications one test counts never refuse another's requests."""
    from django.core.cache import cache

    from apps.core import access

    cache.clear()
    # The namespaces this process saw exist (``access.namespace_check``): a test's rolled-back
    # namespace must not pass for an existing one in the next test.
    access._known.clear()


@pytest.fixture
def eager() -> Iterator[None]:
    """Celery tasks run in this process when sent (on-commit callbacks decide when)."""
    from graphene_project.celery import app

    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    try:
        yield
    finally:
        app.conf.task_always_eager = False


@pytest.fixture
def drive(transactional_db: None, monkeypatch: pytest.MonkeyPatch) -> Driver:
    """The in-process driver: tasks sent during the test are captured and run in this process
    by ``drive.run_until(...)`` (``tests/harness/driver.py``). Whatever is still pending at the
    end (a timer for later) is dropped with the test's data."""
    from graphene_project.celery import Task

    driver = Driver()

    def apply_async(task: Task, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        driver.capture(task, args, kwargs, **options)

    monkeypatch.setattr(Task, "apply_async", apply_async)
    return driver


class WithUser:
    """An ASGI app wrapper that puts ``user`` in the scope, as AuthMiddlewareStack would."""

    def __init__(self, app: Any, user: Any) -> None:
        self.app, self.user = app, user

    async def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
        return await self.app({**scope, "user": self.user}, receive, send)


def read_lines_until(proc: subprocess.Popen[str], predicate: Any, timeout: float) -> list[str]:
    """Lines from ``proc``'s stdout until one satisfies ``predicate`` (read in a thread: no deadlock)."""
    lines: list[str] = []
    found = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if predicate(line):
                found.set()
                return

    threading.Thread(target=reader, daemon=True).start()
    assert found.wait(timeout), f"timed out; got {lines!r}"
    return lines


def interrupt(proc: subprocess.Popen[str]) -> int:
    """Ctrl-C, as in a terminal; the exit status."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


@pytest.fixture
def start_worker(transactional_db: None, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start the test's own worker processes against its (committed) database: for tests that
    kill workers, need a given number of them, or start them with other settings."""
    started: list[Worker] = []
    purge_queue()

    def start(name: str = "w", concurrency: int = 2, env: dict[str, str] | None = None) -> Worker:
        worker = Worker(f"{name}{len(started)}", tmp_path, concurrency, env).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
    purge_queue()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test database, which it drops at the end of the session: first the
    other sessions on it are ended. Graphene's thread pools (deletion batches, database work,
    step threads) that tests drive in this process keep a connection per thread, and Django
    closes only the calling thread's, so PostgreSQL refused the drop and each run left its
    databases behind. The processes the tests start are stopped by then (their fixtures depend
    on this one), so nothing still needs a session."""
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(scope="session")
def shared_web(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebServer]:
    """One web server (daphne) for the session's tests that do not kill or restart it."""
    with django_db_blocker.unblock():
        server = WebServer(tmp_path_factory.mktemp("shared-web")).start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def shared_workers(
    shared_web: WebServer, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[dict[str, str]], SharedWorkers]]:
    """The session's shared worker pools, one per set of settings they run with: two worker
    processes each, for the tests that neither kill nor reconfigure them."""
    pools: dict[tuple[tuple[str, str], ...], SharedWorkers] = {}

    def pool(env: dict[str, str]) -> SharedWorkers:
        key = tuple(sorted(env.items()))
        if key not in pools:
            log_dir = tmp_path_factory.mktemp("shared-workers")
            pools[key] = SharedWorkers(log_dir, env={"GRAPHENE_AGENT_SERVER_URL": shared_web.url, **env})
        return pools[key]

    yield pool
    for each in pools.values():
        each.kill()


@pytest.fixture
def workers(
    request: pytest.FixtureRequest, transactional_db: None, shared_workers: Callable[[dict[str, str]], SharedWorkers]
) -> Iterator[list[Worker]]:
    """Two worker processes with two pool processes each, like a small installation: the
    session's shared ones, idle and with an empty queue when the test starts and again before
    its data is flushed. They take tasks only during the tests that ask for them.

    ``@pytest.mark.worker_env(NAME="value", ...)`` picks the pool that runs with those settings
    too (started by the first test that asks for it, shared by the others)."""
    marker = request.node.get_closest_marker("worker_env")
    pool = shared_workers(dict(marker.kwargs) if marker else {})
    purge_queue()
    yield pool.consume()
    pool.quiesce()


@pytest.fixture
def redis_layer(settings: Any) -> None:
    """This process publishes (command hints, terminal input) where the web processes listen."""
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": CHANNEL_LAYER_URL, "socket_timeout": 30}]},
        }
    }


@pytest.fixture
def web(
    request: pytest.FixtureRequest, transactional_db: None, redis_layer: None, tmp_path: Path
) -> Iterator[WebServer]:
    """The web server (daphne) on this test's database: the session's shared one, or with the
    ``own_web`` marker (tests that kill or restart it) one of the test's own."""
    if request.node.get_closest_marker("own_web"):
        server = WebServer(tmp_path).start()
        yield server
        server.kill()  # its agents are stopped by now; a graceful shutdown would only cost time
        return
    shared: WebServer = request.getfixturevalue("shared_web")
    if not shared.is_alive():
        shared.start()
    yield shared
    shared.quiesce()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One ``graphene up`` (embedded mode) for the session's CLI tests (xdist group graphene-up)."""
    embedded = Server(tmp_path_factory.mktemp("graphene-cli")).start()
    yield embedded
    embedded.kill()  # its data goes with the session: no need to wait for a clean shutdown


@pytest.fixture(scope="session")
def ctl(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Ctl:
    """graphenectl logged in to the session's server (a context saved by ``login``)."""
    ctl = Ctl(tmp_path_factory.mktemp("graphenectl-config"))
    ctl.ok(
        "login",
        "--server",
        server.url,
        "--ca-file",
        str(server.ca_file),
        "--token-stdin",
        "--name",
        "test",
        stdin=server.token + "\n",
    )
    return ctl


@pytest.fixture
def user(django_user_model: Any) -> Any:
    """A developer in the default namespace."""
    alice = django_user_model.objects.create_user(username="alice", password="pw")
    factories.bind(alice, "developer")
    return alice


@pytest.fixture
def api(user: Any) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {factories.api_token(user)}")
    return client


def _client_of(user: Any) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {factories.api_token(user)}")
    return client


@pytest.fixture
def viewer_api(django_user_model: Any) -> APIClient:
    """A viewer in the default namespace: reads, changes nothing."""
    viewer = django_user_model.objects.create_user(username="vera", password="pw")
    factories.bind(viewer, "viewer")
    return _client_of(viewer)


@pytest.fixture
def admin_api(django_user_model: Any) -> APIClient:
    """An admin of every namespace (a binding in ``*``, not a superuser)."""
    admin = django_user_model.objects.create_user(username="root-ops", password="pw")
    factories.bind(admin, "admin", "*")
    return _client_of(admin)


@pytest.fixture
def chromium() -> Iterator[WebDriver]:
    """Debian's Chromium, headless, driven by its chromedriver (``.ci/run`` installs both)."""
    with chromium_driver() as driver:
        yield driver
