"""Real Celery processes: workers a test can SIGKILL, ``celery beat``, and the session's shared workers."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings
from django.db import connection

from tests.harness.wait import wait_for

# The channel layer the web processes, the shared workers and the test process share (agents'
# command hints, the Studio's live hints).
CHANNEL_LAYER_URL = os.environ.get("GRAPHENE_TEST_AGENTS_CHANNEL_LAYER_URL", "redis://127.0.0.1:6379/13")

REPO = Path(__file__).resolve().parents[2]
# Runs a command with SIGINT at its default, so that Ctrl-C (SIGINT) behaves as in a terminal
# even when the test run inherited SIGINT ignored (background jobs of a non-interactive shell).
WITH_DEFAULT_SIGINT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
]


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


def node_name(name: str) -> str:
    """A Celery node name unique to this session: control commands (ping, inspect) are broadcast
    on the broker, which concurrent sessions and pytest-xdist workers share."""
    return f"{name}.{settings.CELERY_TASK_DEFAULT_QUEUE}@{socket.gethostname()}"


class Service:
    """A process the tests start: in its own process group (a kill takes its children too), its
    output in ``log``, started once ``ready()`` says so; an exit while starting fails at once."""

    what = "the process"

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(
        self, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path = REPO, timeout: float = 60
    ) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        wait_for(self._started, timeout=timeout, what=f"{self.what} to be ready (log {self.log})")

    def _started(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.what} exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        return self.ready()

    def ready(self) -> bool:
        raise NotImplementedError

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group, as a crash would: no clean-up of any kind."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM the process group; SIGKILL what has not exited by the deadline."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()


class Worker(Service):
    """A real ``celery worker`` process (prefork) that tests can SIGKILL."""

    def __init__(self, name: str, log_dir: Path, concurrency: int = 2, env: dict[str, str] | None = None) -> None:
        super().__init__(log_dir / f"worker-{name}.log")
        self.name = name
        self.what = f"worker {name}"
        self.node = node_name(name)
        self.concurrency = concurrency
        self.env = env or {}

    def start(self) -> Worker:
        self.log.write_text("")
        self.spawn(
            [
                sys.executable, "-m", "celery", "-A", "graphene_project", "worker",
                "-Q", settings.CELERY_TASK_DEFAULT_QUEUE, "-n", self.node,
                "--pool", "prefork", "--concurrency", str(self.concurrency), "--loglevel", "INFO",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
            ],
            env=process_env(**self.env),
        )  # fmt: skip
        return self

    def ready(self) -> bool:
        from graphene_project.celery import app

        return bool(app.control.ping(destination=[self.node], timeout=0.5))


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


def purge_queue() -> None:
    """Drop every message waiting in this session's queue (the configured queues only)."""
    from graphene_project.celery import app

    app.control.purge()


def queue_length() -> int:
    """Messages waiting in this session's queue, priorities included (the broker is Redis)."""
    from apps.observability.metrics import queue_depths

    depths = queue_depths() or {}
    return sum(depths.values())


def busy(workers: list[Worker]) -> list[str]:
    """Tasks the workers are running or hold to run next (not those with a later ETA)."""
    from graphene_project.celery import app

    inspect = app.control.inspect(destination=[w.node for w in workers], timeout=2.0)
    tasks: list[str] = []
    for answer in (inspect.active(), inspect.reserved()):
        if answer is None or len(answer) < len(workers):
            return ["(a worker did not answer)"]
        tasks += [f"{task.get('name')}{task.get('args')}" for found in answer.values() for task in found]
    return tasks


def revoke_scheduled(workers: list[Worker]) -> None:
    """Revoke the tasks the workers hold for a later ETA (a durable timer, a retry): when they
    come due, in another test, their rows are gone and nothing of theirs may run."""
    from graphene_project.celery import app

    answer = app.control.inspect(destination=[w.node for w in workers], timeout=2.0).scheduled() or {}
    ids = [entry["request"]["id"] for found in answer.values() for entry in found]
    if ids:
        app.control.revoke(ids, destination=[w.node for w in workers])


class SharedWorkers:
    """Worker processes started once per session, for tests that neither kill nor reconfigure them.

    They load every pipeline module the suite's runs use and know the shared web server's URL,
    so tests need not reconfigure them. They take tasks from the queue only during a test that
    asked for them (``consume``); ``quiesce`` runs after it, before the database is flushed:
    nothing of one test may still run (or write) in the next one.
    """

    PIPELINE_MODULES = ",".join(
        [
            "tests.pipelines.sample",
            "tests.git.pipelines",
            "tests.secrets.pipelines",
            "tests.artifacts.pipelines",
            "tests.docker.pipelines",
            "tests.agents.call_pipelines",
            "tests.agents.capability_pipelines",
            "tests.agents.ssh_pipelines",
        ]
    )

    _pools = itertools.count()

    def __init__(self, log_dir: Path, *, count: int = 2, env: dict[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.env = {
            "GRAPHENE_PIPELINE_MODULES": self.PIPELINE_MODULES,
            # Their hints reach the shared web server's websockets, as in production.
            "GRAPHENE_TEST_CHANNEL_LAYER_URL": CHANNEL_LAYER_URL,
            **(env or {}),
        }
        pool = next(SharedWorkers._pools)  # node names are unique within the session
        self.workers = [Worker(f"shared{pool}w{i}", log_dir, 2, self.env) for i in range(count)]

    def consume(self) -> list[Worker]:
        """The workers, (re)started if one is not running (a crash of one never spreads to other
        tests), taking tasks from the queue."""
        for worker in self.workers:
            if not worker.is_alive():
                worker.stop()
                worker.start()
        self._consumer("add_consumer")
        return self.workers

    def quiesce(self, timeout: float = 60) -> None:
        """Stop taking tasks, drop what is queued and what waits for a later ETA, and wait until
        the workers run nothing and nothing is queued."""
        self._consumer("cancel_consumer")

        def quiet() -> bool:
            purge_queue()
            revoke_scheduled(self.workers)
            return not busy(self.workers) and queue_length() == 0

        wait_for(quiet, timeout=timeout, interval=0.1, what=f"the shared workers to be idle: {busy(self.workers)}")

    def _consumer(self, command: str) -> None:
        from graphene_project.celery import app

        queue = settings.CELERY_TASK_DEFAULT_QUEUE
        nodes = [w.node for w in self.workers if w.is_alive()]
        replies = getattr(app.control, command)(queue, destination=nodes, reply=True, timeout=10)
        assert len(replies or []) == len(nodes), f"{command}({queue}) answered by {replies}, not {nodes}"

    def kill(self) -> None:
        """At the session's end: nothing they hold matters any more (the database goes next)."""
        for worker in self.workers:
            worker.kill()
