"""Plumbing shared by the run benchmarks (``step_overhead``, ``run_latency``, ``suspended_runs``).

Builds on ``bench/_common.py`` (isolated database, Redis db, queue and data directory; worker
start/stop) and adds what runs need:

* ``runs_environment``: ``_common.bench_environment`` with the settings module
  ``bench._runs_settings`` (in this process and the workers), pipelines from
  ``bench._runs_pipelines`` only (no example directories), production lease lengths
  (``GRAPHENE_RUN_LEASE_SECONDS=30``, ``GRAPHENE_OPERATION_LEASE_SECONDS=120``; the test
  settings' 4 s / 3 s make the heartbeat and the reconciler far busier than an installation)
  and, by default, the production (Redis) channel layer, in the benchmark's Redis db;
* a ``celery beat`` process, for benchmarks that measure what a real installation runs;
* per-process-group CPU and memory accounting from ``/proc`` (a worker and its pool children
  share one process group: ``_common.start_workers`` starts each in its own session).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._common import (  # noqa: E402
    REDIS_HOST,
    REDIS_PORT,
    Bench,
    Workers,
    django_setup_and_migrate,
    recreate_database,
    start_workers,
)

WORKER_SETTINGS = "bench._runs_settings"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def runs_environment(
    name: str, *, redis_db: int, channel_layer: str = "redis", extra: dict[str, str] | None = None
) -> Iterator[Bench]:
    """Like ``_common.bench_environment`` (same database/queue/data-dir naming and clean-up),
    with ``bench._runs_settings`` and the run benchmarks' environment (see the module doc).

    ``channel_layer``: ``redis`` (production) or ``memory`` (the test settings' layer)."""
    bench = Bench(
        name=name,
        redis_db=int(os.environ.get("GRAPHENE_BENCH_REDIS_DB", redis_db)),
        db_name=f"graphene_bench_{name}",
        queue=f"graphene-bench-{name}-{uuid.uuid4().hex[:8]}",
        data_dir=Path(tempfile.mkdtemp(prefix=f"graphene-bench-{name}-")),
    )
    os.environ.update(bench.env())
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": WORKER_SETTINGS,
            "GRAPHENE_PIPELINE_MODULES": "bench._runs_pipelines",
            "GRAPHENE_PIPELINE_DIRS": "",
            "GRAPHENE_RUN_LEASE_SECONDS": "30",
            "GRAPHENE_OPERATION_LEASE_SECONDS": "120",
            **(extra or {}),
        }
    )
    if channel_layer == "redis":
        os.environ["GRAPHENE_CHANNEL_LAYER_URL"] = bench.broker_url
    else:
        os.environ.pop("GRAPHENE_CHANNEL_LAYER_URL", None)
    import redis

    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=bench.redis_db)
    bench.redis_keys_before = {k if isinstance(k, bytes) else k.encode() for k in client.keys("*")}
    try:
        recreate_database(bench.db_name)
        django_setup_and_migrate()
        yield bench
    finally:
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        with contextlib.suppress(Exception):
            created = [k for k in client.keys("*") if k not in bench.redis_keys_before or bench.queue.encode() in k]
            if created:
                client.delete(*created)
        shutil.rmtree(bench.data_dir, ignore_errors=True)


def start_run_workers(
    bench: Bench, *, count: int, concurrency: int, extra_env: dict[str, str] | None = None
) -> Workers:
    """``count`` prefork workers x ``concurrency`` on the bench queue, with the bench settings.

    (``_common.start_workers`` passes ``bench.env()``, whose settings module is the test one.)"""
    env = {"DJANGO_SETTINGS_MODULE": WORKER_SETTINGS, **(extra_env or {})}
    return start_workers(bench, count=count, concurrency=concurrency, pool="prefork", extra_env=env)


def start_queue_worker(bench: Bench, *, queue: str, label: str, concurrency: int) -> Workers:
    """One prefork worker on another queue than the bench's (e.g. the convergence queue)."""
    env = {**os.environ, **bench.env(), "DJANGO_SETTINGS_MODULE": WORKER_SETTINGS}
    node = f"{bench.queue}-{label}@%h"
    path = bench.data_dir / f"{label}.log"
    args = [
        sys.executable, "-m", "celery", "-A", "graphene_project", "worker", "-Q", queue, "-n", node,
        "--pool", "prefork", "--concurrency", str(concurrency), "--loglevel", "WARNING",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    with path.open("wb") as out:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Workers([proc], [node.replace("%h", socket.gethostname())], [path])


def start_beat(bench: Bench, extra_env: dict[str, str] | None = None) -> Workers:
    """A ``celery beat`` (the installation's periodic housekeeping), in its own session."""
    env = {**os.environ, **bench.env(), "DJANGO_SETTINGS_MODULE": WORKER_SETTINGS, **(extra_env or {})}
    path = bench.data_dir / "beat.log"
    args = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "graphene_project",
        "beat",
        "--loglevel",
        "WARNING",
        "--schedule",
        str(bench.data_dir / "celerybeat-schedule"),
    ]
    with path.open("wb") as out:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Workers([proc], [], [path])


def stop_group(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


# --- /proc accounting ----------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may contain spaces: split after its closing parenthesis.
    return raw[raw.rindex(")") + 2 :].split()


def group_pids(pgids: Iterable[int]) -> list[int]:
    """Live processes whose process group is one of ``pgids`` (a worker and its pool children)."""
    wanted = set(pgids)
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        # After comm: state(0) ppid(1) pgrp(2) ...
        if fields is not None and int(fields[2]) in wanted:
            pids.append(int(entry))
    return pids


def cpu_seconds(pgids: Iterable[int]) -> float:
    """utime+stime of the groups' live processes plus cutime+cstime (children they reaped)."""
    ticks = 0
    for pid in group_pids(pgids):
        fields = _stat_fields(pid)
        if fields is not None:
            # utime, stime, cutime, cstime are stat fields 14-17: indexes 11-14 after comm.
            ticks += sum(int(v) for v in fields[11:15])
    return ticks / CLOCK_TICKS


def _status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def memory_kb(pgids: Iterable[int]) -> tuple[int, int, int]:
    """(sum of VmRSS, sum of PSS, process count) over the groups' live processes.

    RSS counts pages shared by a prefork parent and its children once per process; PSS
    divides them among the sharers, so the PSS sum is what the pool really occupies."""
    pids = group_pids(pgids)
    return sum(_status_kb(p, "VmRSS") for p in pids), sum(_pss_kb(p) for p in pids), len(pids)


@dataclass
class MemorySampler:
    """Samples the groups' summed RSS/PSS every ``interval`` seconds in a thread; keeps peaks."""

    pgids: Sequence[int]
    interval: float = 0.5
    peak_rss_kb: int = 0
    peak_pss_kb: int = 0
    peak_procs: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        rss, pss, procs = memory_kb(self.pgids)
        self.peak_rss_kb = max(self.peak_rss_kb, rss)
        self.peak_pss_kb = max(self.peak_pss_kb, pss)
        self.peak_procs = max(self.peak_procs, procs)
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> MemorySampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample()


# --- statistics ----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100): a value that was actually observed."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def redis_client(bench: Bench) -> Any:
    import redis

    return redis.Redis.from_url(bench.broker_url)
