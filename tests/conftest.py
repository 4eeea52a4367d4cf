"""Shared fixtures: real Celery worker processes, API clients, waiting on conditions."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from django.conf import settings
from django.db import connection
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def wait_for(condition: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05, what: str = "") -> T:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(interval)


def process_env(**extra: str) -> dict[str, str]:
    """Environment for processes that share this test session's database, queue and data dir."""
    db = connection.settings_dict
    env = dict(os.environ)
    host, port = db["HOST"] or "127.0.0.1", db["PORT"] or 5432
    env.update(
        DJANGO_SETTINGS_MODULE="graphene_project.settings.test",
        GRAPHENE_DATABASE_URL=f"postgresql://{db['USER']}@{host}:{port}/{db['NAME']}",
        PYTHONPATH=str(REPO),
    )
    env.update(extra)
    return env


class Worker:
    """A real ``celery worker`` process (prefork) that tests can SIGKILL."""

    def __init__(self, name: str, log_dir: Path, concurrency: int = 2) -> None:
        self.name = name
        self.log = log_dir / f"worker-{name}.log"
        self.concurrency = concurrency
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        self.log.write_text("")
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "celery", "-A", "graphene_project", "worker",
                    "-Q", settings.CELERY_TASK_DEFAULT_QUEUE, "-n", f"{self.name}@%h",
                    "--pool", "prefork", "--concurrency", str(self.concurrency), "--loglevel", "INFO",
                    "--without-gossip", "--without-mingle", "--without-heartbeat",
                ],
                cwd=REPO,
                env=process_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        wait_for(self._ready, timeout=60, what=f"worker {self.name} to be ready (log {self.log})")
        return self

    def _ready(self) -> bool:
        from graphene_project.celery import app

        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(
                f"worker {self.name} exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
            )
        return bool(app.control.ping(destination=[f"{self.name}@{socket.gethostname()}"], timeout=0.5))

    def kill(self) -> None:
        """SIGKILL the whole worker (main process and pool children), as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill()


@contextlib.contextmanager
def running_beat(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``celery beat`` (TTL expiry, reconciler, drift ticks) for the block's duration."""
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "graphene_project", "beat", "-s", str(tmp_path / "beat"), "-l", "INFO"],
        cwd=REPO,
        env=process_env(),
        stdout=(tmp_path / "beat.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        yield beat
    finally:
        beat.terminate()
        beat.wait(timeout=20)


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


def purge_queue() -> None:
    from graphene_project.celery import app

    app.control.purge()  # the configured queues: this session's private queue


@pytest.fixture
def start_worker(transactional_db: None, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start real worker processes against this test's (committed) database."""
    started: list[Worker] = []
    purge_queue()

    def start(name: str = "w", concurrency: int = 2) -> Worker:
        worker = Worker(f"{name}{len(started)}", tmp_path, concurrency).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
    purge_queue()


@pytest.fixture
def workers(start_worker: Callable[..., Worker]) -> list[Worker]:
    """Two worker processes with two pool processes each, like a small installation."""
    return [start_worker(), start_worker()]


@pytest.fixture
def user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="alice", password="pw")


@pytest.fixture
def api(user: Any) -> APIClient:
    client = APIClient()
    token = Token.objects.create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client
