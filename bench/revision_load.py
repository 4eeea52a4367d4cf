"""Benchmark: how long does delivering pipeline code as a revision take, and what does a worker
pay the first time it runs a revision it has not seen?

A local git repository holds 50 pipeline modules (``rl.p00`` … ``rl.p49``, each one step that
pushes ``time.time()`` onto a Redis list) and a shared helper module. Each round commits a
change to the helper (new content: a new revision), then:

* **materialize**: resolve ``main`` to its commit, export the commit's tree, and
  ``revision_materialize`` it (canonical archive, describe in a fresh subprocess that imports
  the 50 modules, blob store, row, activation of the 50 pipelines) — the path of
  ``graphenectl source sync``;
* **first load**: start a run of one of its pipelines on a worker that has never seen the
  revision (it fetches the archive from the blob store, unpacks it and imports it), then a
  second run of the same revision (cached); the difference of their start-to-first-step
  latencies is the first-load overhead;
* a run of an installed pipeline (``bench.first``, as in ``run_latency``), interleaved: a run on
  a cached revision must cost the same.

One prefork worker with concurrency 1 (one process: its cache is the one measured).

    .venv/bin/python bench/revision_load.py [--rounds 7]

Last line: ``materialize_s=<median> first_load_ms=<median> cached_p50_ms=<x> installed_p50_ms=<y>``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import figures, load_1m, log, median, stop_workers, wait_until, wait_workers_ready
from bench._runs_common import percentile, redis_client, runs_environment, start_run_workers

NAME = "revision_load"
MODULES = 50

MODULE = '''"""Pipeline {n:02d} of the revision-load benchmark."""

from pydantic import BaseModel
from graphene_sdk import Context, pipeline

from .shared import stamp


class In(BaseModel):
    key: str


@pipeline("rl.p{n:02d}", inputs=In)
def p{n:02d}(ctx: Context, inputs: In) -> None:
    """One step that reports when it executed."""
    ctx.step("first", stamp, inputs.key)
'''

SHARED = '''"""What every pipeline of the benchmark does: push the time onto a Redis list. Round {round}."""

import time

_client = None


def stamp(key: str) -> float:
    global _client
    if _client is None:
        import redis
        from django.conf import settings

        _client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    now = time.time()
    _client.rpush(key, repr(now))
    return now
'''


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def make_repository(base: Path) -> Path:
    repo = base / "pipelines-repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "bench@example.invalid")
    git(repo, "config", "user.name", "bench")
    for n in range(MODULES):
        (repo / f"m{n:02d}.py").write_text(MODULE.format(n=n))
    return repo


def commit_round(repo: Path, round_no: int) -> None:
    (repo / "shared.py").write_text(SHARED.format(round=round_no))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"round {round_no}")


def materialize(url: str) -> tuple[Any, float]:
    from apps.pipelines.delivery import gitsource, revisions

    began = time.perf_counter()
    commit = gitsource.resolve(url, "main")
    scratch = Path(tempfile.mkdtemp(prefix="rl-export-"))
    try:
        gitsource.export(url, commit, scratch, max_bytes=revisions.max_bytes())
        done = revisions.revision_materialize(tree=scratch, namespace="default", commit=commit, activate=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.perf_counter() - began
    assert done.created, "each round's content is new"
    assert len(done.activated) == MODULES, done.activated
    return done.revision, elapsed


def latency(client: Any, pipeline: str, key: str) -> float:
    """Start to first step (ms), waiting for the run to succeed before returning."""
    from apps.pipelines.models import Run
    from apps.pipelines.services import run_start

    t0 = time.time()
    run = run_start(pipeline_name=pipeline, inputs={"key": key})
    popped = client.blpop([key], timeout=120)
    if popped is None:
        run.refresh_from_db()
        raise TimeoutError(f"run {run.pk} of {pipeline}: no step within 120 s ({run.status}: {run.error[:300]})")
    wait_until(
        lambda: Run.objects.filter(pk=run.pk, status="succeeded").exists(),
        timeout=60,
        interval=0.005,
        what=f"run {run.pk} to succeed",
    )
    return (float(popped[1]) - t0) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    materialize_s: list[float] = []
    first_load: list[float] = []
    cached: list[float] = []
    installed: list[float] = []
    workers = None
    with runs_environment(NAME, redis_db=15) as bench:
        client = redis_client(bench)
        repo = make_repository(bench.data_dir)
        url = f"file://{repo}"
        try:
            workers = start_run_workers(bench, count=1, concurrency=1)
            log(f"worker ready in {wait_workers_ready(workers):.1f}s")
            for i in range(3):  # warm-up: the worker's first runs, Django's first queries
                latency(client, "bench.first", f"bench:{bench.queue}:w{i}")
            for r in range(args.rounds):
                commit_round(repo, r)
                revision, seconds = materialize(url)
                pipeline = f"rl.p{r % MODULES:02d}"
                first = latency(client, pipeline, f"bench:{bench.queue}:f{r}")
                again = latency(client, pipeline, f"bench:{bench.queue}:c{r}")
                plain = latency(client, "bench.first", f"bench:{bench.queue}:i{r}")
                materialize_s.append(seconds)
                first_load.append(first - again)
                cached.append(again)
                installed.append(plain)
                log(
                    f"round {r + 1}/{args.rounds}: revision {revision.short} materialized in {seconds:.2f}s; "
                    f"first run {first:.1f} ms, cached {again:.1f} ms, installed {plain:.1f} ms; load {load_1m():.2f}"
                )
        finally:
            stop_workers(workers)

    print(
        "detail: "
        f"materialize_max_s={max(materialize_s):.3f} first_load_max_ms={max(first_load):.1f} "
        f"cached_p95_ms={percentile(cached, 95):.2f} installed_p95_ms={percentile(installed, 95):.2f} "
        f"modules={MODULES} rounds={args.rounds} load_1m={load_1m():.2f}",
        flush=True,
    )
    figures(
        {
            "materialize_s": median(materialize_s),
            "first_load_ms": median(first_load),
            "cached_p50_ms": percentile(cached, 50),
            "installed_p50_ms": percentile(installed, 50),
        }
    )


if __name__ == "__main__":
    main()
