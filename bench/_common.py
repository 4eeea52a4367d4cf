"""Shared plumbing for the benchmarks in ``bench/``.

Each benchmark is self-contained: given PostgreSQL and Redis on their default local ports it

* points the ``GRAPHENE_*`` environment at its own database (dropped and recreated), its own
  Redis database and queue name, and a temporary data directory — all *before*
  ``django.setup()``, so the settings module reads them;
* migrates that database;
* starts the Celery workers it needs as subprocesses (in their own process group, with the
  same environment) and always stops them, also on error;
* removes what it left in Redis, and its data directory;
* prints its figures as ``name=value`` pairs on its last line.

Trees are bulk-loaded with ``COPY`` (correct mptt columns: one ``tree_id`` per root, nested
``lft``/``rght``, ``level``) instead of thousands of service calls, which would make the
set-up slower than the thing being measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PG_HOST = os.environ.get("GRAPHENE_BENCH_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("GRAPHENE_BENCH_PG_PORT", "5432"))
PG_USER = os.environ.get("GRAPHENE_BENCH_PG_USER", "postgres")
REDIS_HOST = os.environ.get("GRAPHENE_BENCH_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("GRAPHENE_BENCH_REDIS_PORT", "6379"))


def log(message: str) -> None:
    """Progress goes to stderr; stdout's last line is reserved for the figures."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def figures(pairs: dict[str, Any]) -> None:
    """Print the result line: ``name=value`` pairs, the last line of stdout."""

    def fmt(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
        return str(value)

    print(" ".join(f"{k}={fmt(v)}" for k, v in pairs.items()), flush=True)


@dataclass
class Bench:
    """One benchmark's isolated environment: database, Redis db + queue, data directory."""

    name: str
    redis_db: int
    db_name: str = ""
    queue: str = ""
    data_dir: Path = field(default_factory=Path)
    redis_keys_before: set[bytes] = field(default_factory=set)

    @property
    def database_url(self) -> str:
        return f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{self.db_name}"

    @property
    def broker_url(self) -> str:
        return f"redis://{REDIS_HOST}:{REDIS_PORT}/{self.redis_db}"

    def env(self) -> dict[str, str]:
        """The environment for this process and every worker it starts."""
        return {
            "DJANGO_SETTINGS_MODULE": "graphene_project.settings.test",
            "GRAPHENE_DATABASE_URL": self.database_url,
            "GRAPHENE_BROKER_URL": self.broker_url,
            "GRAPHENE_QUEUE": self.queue,
            "GRAPHENE_DATA_DIR": str(self.data_dir),
            "GRAPHENE_TEST_WORLD_DIR": str(self.data_dir / "test-world"),
            "GRAPHENE_LOG_LEVEL": os.environ.get("GRAPHENE_LOG_LEVEL", "WARNING"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
        }


@contextlib.contextmanager
def bench_environment(name: str, *, redis_db: int, data_parent: str | None = None) -> Iterator[Bench]:
    """Set up the isolated environment, ``django.setup()`` + migrate, and clean up afterwards.
    ``data_parent``: where the data directory (and the test world in it) is made; the system's
    temporary directory by default.

    The Redis db can be overridden with ``GRAPHENE_BENCH_REDIS_DB``; keys this run creates in it
    are deleted at the end (keys that were there before are left alone).
    """
    bench = Bench(
        name=name,
        redis_db=int(os.environ.get("GRAPHENE_BENCH_REDIS_DB", redis_db)),
        db_name=f"graphene_bench_{name}",
        queue=f"graphene-bench-{name}-{uuid.uuid4().hex[:8]}",
        data_dir=Path(tempfile.mkdtemp(prefix=f"graphene-bench-{name}-", dir=data_parent)),
    )
    os.environ.update(bench.env())
    import redis

    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=bench.redis_db)
    bench.redis_keys_before = set(client.keys("*"))  # type: ignore[arg-type]  # redis-py types keys as bytes | str
    try:
        recreate_database(bench.db_name)
        django_setup_and_migrate()
        yield bench
    finally:
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        for _attempt in range(2):  # a stopping worker may still write a binding key
            with contextlib.suppress(Exception):
                clean_redis(client, bench)
            time.sleep(0.2)
        shutil.rmtree(bench.data_dir, ignore_errors=True)


# Keys kombu/Celery share between all queues of a Redis db.
_SHARED_KEYS = {b"unacked", b"unacked_index", b"unacked_mutex", b"_kombu.binding_deadlines"}


def clean_redis(client: Any, bench: Bench) -> None:
    """Delete this run's keys: those naming its queue and its ping reply queues; the keys
    Celery shares between queues only if no other queue lives in this db (someone else may
    be using it)."""
    keys = set(client.keys("*"))
    mine = {k for k in keys if bench.queue.encode() in k}
    mine |= {k for k in keys if k.endswith(b".reply.celery.pidbox") and k not in bench.redis_keys_before}
    others = {
        k
        for k in keys - mine
        if k.startswith((b"_kombu.binding.", b"_kombu.binding_permanent.")) and b"celery.pidbox" not in k
    }
    if not others:
        mine |= {k for k in keys if (k in _SHARED_KEYS or b"celery.pidbox" in k) and k not in bench.redis_keys_before}
    if mine:
        client.delete(*mine)


def recreate_database(db_name: str) -> None:
    import psycopg

    with psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db_name}"')


def django_setup_and_migrate() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)


def use_database(db_name: str, *, migrate: bool = False) -> None:
    """Point the default connection at another database (same server): the services and the
    ORM follow. ``migrate`` creates it afresh and migrates it."""
    from django.core.management import call_command
    from django.db import connection

    connection.close()
    if migrate:
        recreate_database(db_name)
    connection.settings_dict["NAME"] = db_name
    if migrate:
        call_command("migrate", interactive=False, verbosity=0)


def process_cpu_seconds(pid: int) -> float:
    """User+system CPU seconds used so far by process ``pid`` (e.g. a PostgreSQL backend)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_run_ns(pid: int) -> int:
    """Nanoseconds the main thread of process ``pid`` has run on a CPU so far
    (``/proc/<pid>/schedstat``): fine enough to charge one query to a PostgreSQL backend (one
    thread), where ``process_cpu_seconds`` counts in clock ticks (10 ms)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def analyze(*tables: str, vacuum: bool = False) -> None:
    from django.db import connection

    verb = "VACUUM ANALYZE" if vacuum else "ANALYZE"
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"{verb} {table}")


# --- bulk trees ----------------------------------------------------------------------------

RECORD_COLUMNS = (
    "id",
    "created_at",
    "updated_at",
    "kind",
    "name",
    "namespace",
    "spec",
    "outputs",
    "phase",
    "conditions",
    "labels",
    "generation",
    "observed_generation",
    "attempts",
    "last_error",
    "lft",
    "rght",
    "tree_id",
    "level",
    "parent_id",
    "created_by_run_id",
    "drift_policy",
    "heals",
    "healing",
    "protected",
    "protected_by",
)


@dataclass
class Node:
    id: uuid.UUID
    parent_id: uuid.UUID | None
    lft: int
    rght: int
    level: int


def tree_nodes(fanouts: Sequence[int]) -> list[Node]:
    """Nodes of a tree whose level ``i`` nodes each have ``fanouts[i]`` children, in pre-order.

    mptt numbering: a node's ``lft`` comes before every descendant's, its ``rght`` after, and
    ``rght - lft + 1 == 2 * subtree size``; the root is ``lft=1``.
    """
    nodes: list[Node] = []

    def build(parent: uuid.UUID | None, level: int, lft: int) -> int:
        node = Node(uuid.uuid4(), parent, lft, 0, level)
        nodes.append(node)
        nxt = lft + 1
        if level < len(fanouts):
            for _ in range(fanouts[level]):
                nxt = build(node.id, level + 1, nxt)
        node.rght = nxt
        return nxt + 1

    build(None, 0, 1)
    return nodes


def next_tree_id() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT COALESCE(MAX(tree_id), 0) + 1 FROM records_record")
        return int(cursor.fetchone()[0])


def copy_trees(
    trees: Sequence[tuple[int, Sequence[Node]]],
    *,
    root_kind: str,
    child_kind: str,
    child_spec: dict[str, Any],
    phase: str,
    name_prefix: str,
    with_events: bool = True,
    namespace: str = "default",
) -> int:
    """COPY the given ``(tree_id, nodes)`` trees into records_record (and one ``declared``
    event per record into records_event, as a real installation has), all in ``namespace``.
    Returns rows written."""
    from django.db import connection, transaction

    from apps.records.models import TREE_ID_SEQUENCE

    now = datetime.now(UTC)
    spec_json = json.dumps(child_spec)
    rows = 0
    with transaction.atomic(), connection.cursor() as wrapper:
        cursor = wrapper.cursor  # the psycopg cursor, for COPY
        with cursor.copy(f"COPY records_record ({', '.join(RECORD_COLUMNS)}) FROM STDIN") as copy:
            for tree_id, nodes in trees:
                root_id = nodes[0].id
                for i, n in enumerate(nodes):
                    is_root = n.parent_id is None
                    copy.write_row(
                        (
                            n.id,
                            now,
                            now,
                            root_kind if is_root else child_kind,
                            f"{name_prefix}-{tree_id}" if is_root else f"n{i}",
                            namespace,
                            "{}" if is_root else spec_json,
                            "{}",
                            phase,
                            "[]",
                            "{}",
                            1,
                            1,
                            0,
                            "",
                            n.lft,
                            n.rght,
                            tree_id,
                            n.level,
                            n.parent_id,
                            None if is_root or root_kind != "graphene.run" else root_id,
                            "heal",
                            0,
                            False,
                            False,
                            "",
                        )
                    )
                    rows += 1
        if with_events:
            with cursor.copy(
                "COPY records_event (record_id, type, reason, message, data, created_at) FROM STDIN"
            ) as copy:
                for _tree_id, nodes in trees:
                    for n in nodes:
                        copy.write_row((n.id, "declared", "Declared", "", "{}", now))
        # New roots take their tree ids from a sequence (apps/records/models.py): move it past
        # the ids written here (nothing happens while it does not exist yet).
        wrapper.execute("SELECT setval(to_regclass(%s), (SELECT MAX(tree_id) FROM records_record))", [TREE_ID_SEQUENCE])
    return rows


# --- workers -------------------------------------------------------------------------------


@dataclass
class Workers:
    procs: list[subprocess.Popen[bytes]]
    names: list[str]
    logs: list[Path]

    def tail(self, lines: int = 30) -> str:
        out = []
        for path in self.logs:
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)


def start_workers(
    bench: Bench, *, count: int, concurrency: int, pool: str, extra_env: dict[str, str] | None = None
) -> Workers:
    """Start ``count`` ``celery worker`` processes on the bench queue, each in its own session
    (process group), so stopping kills the pool children too."""
    env = {**os.environ, **bench.env(), **(extra_env or {})}
    procs, names, logs = [], [], []
    for i in range(count):
        node = f"{bench.queue}-w{i}@%h"
        path = bench.data_dir / f"worker{i}.log"
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "graphene_project",
            "worker",
            "-Q",
            bench.queue,
            "-n",
            node,
            "--pool",
            pool,
            "--concurrency",
            str(concurrency),
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        with path.open("wb") as out:
            procs.append(
                subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            )
        names.append(node.replace("%h", _hostname()))
        logs.append(path)
    return Workers(procs, names, logs)


def _hostname() -> str:
    import socket

    return socket.gethostname()


def wait_workers_ready(workers: Workers, *, timeout: float = 60.0) -> float:
    """Ping the workers by node name until all answer (or fail at the deadline)."""
    from graphene_project.celery import app

    start = time.monotonic()
    deadline = start + timeout
    pending = set(workers.names)
    while pending:
        for proc in workers.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a worker exited with {proc.returncode} while starting:\n{workers.tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers {sorted(pending)} not ready after {timeout}s:\n{workers.tail()}")
        replies = app.control.ping(destination=sorted(pending), timeout=0.5) or []
        for reply in replies:
            pending -= set(reply)
    return time.monotonic() - start


def group_cpu_seconds(workers: Workers) -> float:
    """User+system CPU seconds used so far by every live process in the workers' process groups
    (the worker and its pool children). Less sensitive than wall time to other load."""
    groups = {proc.pid for proc in workers.procs}
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state (3rd field of stat): pgrp is field 5, utime/stime 14/15.
        if int(fields[2]) in groups:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def stop_workers(workers: Workers | None, *, grace: float = 10.0) -> None:
    """SIGTERM each worker's process group (warm shutdown), SIGKILL what is left after ``grace``."""
    if workers is None:
        return
    for proc in workers.procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in workers.procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    for proc in workers.procs:
        # The group may still hold pool children even if the main process is gone.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def wait_until(
    predicate: Callable[[], bool], *, timeout: float, interval: float = 0.05, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached after {timeout}s")
        time.sleep(interval)


def load_1m() -> float:
    """The 1-minute load average: other work on the machine skews every figure; print it."""
    return os.getloadavg()[0]


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
