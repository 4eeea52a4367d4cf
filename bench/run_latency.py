"""Benchmark: how long from starting a run to its first step executing, against bare Celery?

Graphene: ``run_start`` of the pipeline ``bench.first`` (``bench/_runs_pipelines.py``), whose
only step pushes ``time.time()`` onto a Redis list when it executes. Latency = that time -
the time just before ``run_start`` was called. It covers the whole path: input validation,
the transaction creating the run and its root record (whose message to a worker leaves from
inside it, once the statement numbering the run holds its start lock), the worker's dequeue,
taking the lease (after that transaction's commit), loading the journal, replaying into the
function and dispatching the step.

Celery baseline: ``send_task`` of ``bench.celery_stamp`` (a task whose body only pushes
``time.time()`` onto a Redis list) to the same queue, on the same broker, executed by the
same worker. Latency = the time in the task body - the time just before ``send_task``.
Both are one-way figures measured the same way (no result backend, no polling: the benchmark
waits with ``BLPOP``); the Celery round trip as seen by the sender is reported too.

One worker process (prefork, concurrency 1) as in ``step_overhead``. ``--n`` (50) runs,
strictly one at a time: the next starts only when the previous run has succeeded, its
root record is tombstoned and its last hint to watchers has arrived (so clean-up work and
hints never queue in front of a measurement); every other pair measures Celery first (so
each kind follows that wait as often as the other). Graphene
and Celery samples are interleaved so that load changes on the machine hit both; three
warm-up rounds are discarded.

    .venv/bin/python bench/run_latency.py [--n 50]

Last line: ``p50_ms=<x> p95_ms=<y> celery_p50_ms=<z> ratio_vs_celery=<x/z>``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    figures,
    load_1m,
    log,
    stop_workers,
    wait_until,
    wait_workers_ready,
)
from bench._runs_common import percentile, redis_client, runs_environment, start_run_workers

NAME = "run_latency"
WARMUP = 3


class Hints:
    """The runs' hints as a person watching gets them, through the network channel layer: a
    sample ends only once its run's last hint has arrived, so that no hint of it is still on
    its way (they leave a little later, gathered: ``apps/core/events.py``) while the next
    sample, Graphene's or Celery's, is measured."""

    def __init__(self) -> None:
        from channels.layers import get_channel_layer

        self.loop = asyncio.new_event_loop()  # one loop: the layer keeps its connections per loop
        self.layer = get_channel_layer()
        self.channel = self.loop.run_until_complete(self.layer.new_channel())
        self.loop.run_until_complete(self.layer.group_add("runs", self.channel))

    def wait_last(self, run_id: str, status: str, timeout: float = 60) -> None:
        async def last() -> None:
            while True:
                hint = await self.layer.receive(self.channel)
                if hint.get("id") == run_id and hint.get("status") == status:
                    return

        self.loop.run_until_complete(asyncio.wait_for(last(), timeout))


def graphene_once(client: Any, key: str, hints: Hints | None) -> dict[str, float]:
    from apps.pipelines.models import Run
    from apps.pipelines.services import run_start
    from apps.records.models import Record

    t0 = time.time()
    run = run_start(pipeline_name="bench.first", inputs={"key": key})
    t_returned = time.time()
    popped = client.blpop([key], timeout=60)
    t_seen = time.time()
    if popped is None:
        raise TimeoutError(f"run {run.pk}: its step did not execute within 60 s")
    t_step = float(popped[1])

    def done() -> bool:
        return (
            Run.objects.filter(pk=run.pk, status="succeeded").exists()
            and Record.objects.filter(pk=str(run.record_id), phase="deleted").exists()
        )

    try:
        wait_until(done, timeout=60, interval=0.005, what=f"run {run.pk} to succeed and its record to be deleted")
    except TimeoutError:
        run.refresh_from_db()
        root = Record.objects.filter(pk=str(run.record_id)).values("phase", "deletion_requested_at").first()
        raise TimeoutError(f"run {run.pk} is {run.status} ({run.error[:500]}); its root record: {root}") from None
    if hints is not None:
        hints.wait_last(str(run.pk), "succeeded")
    run.refresh_from_db()
    assert run.started_at is not None
    return {
        "first_step_ms": (t_step - t0) * 1000,
        "run_start_ms": (t_returned - t0) * 1000,  # the caller's share: the transaction + send
        "acquired_ms": (run.started_at.timestamp() - t0) * 1000,  # worker holds the lease
        "seen_ms": (t_seen - t0) * 1000,
    }


def celery_once(client: Any, key: str, queue: str) -> dict[str, float]:
    from graphene_project.celery import app

    t0 = time.time()
    app.send_task("bench.celery_stamp", args=[key], queue=queue)
    popped = client.blpop([key], timeout=60)
    t_seen = time.time()
    if popped is None:
        raise TimeoutError("the bare Celery task did not execute within 60 s")
    return {"exec_ms": (float(popped[1]) - t0) * 1000, "round_trip_ms": (t_seen - t0) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument(
        "--channel-layer",
        choices=["redis", "memory"],
        default="redis",
        help="run/record notifications through Redis as in production (default) or in memory as in the tests",
    )
    args = parser.parse_args()

    graphene: list[dict[str, float]] = []
    celery: list[dict[str, float]] = []
    workers = None
    with runs_environment(NAME, redis_db=8, channel_layer=args.channel_layer) as bench:
        client = redis_client(bench)
        try:
            workers = start_run_workers(bench, count=1, concurrency=1)
            log(f"worker ready in {wait_workers_ready(workers):.1f}s")
            # Through the in-memory layer hints never leave the worker's process.
            hints = Hints() if args.channel_layer == "redis" else None
            for i in range(WARMUP + args.n):
                # Every other pair the other way round: a sample that follows a Graphene
                # sample's wait for its clean-up and hints finds the worker idle for a while,
                # one that follows a Celery sample finds it busy a moment ago; both kinds get
                # both, half the time each.
                if i % 2:
                    c = celery_once(client, f"bench:{bench.queue}:c{i}", bench.queue)
                    g = graphene_once(client, f"bench:{bench.queue}:g{i}", hints)
                else:
                    g = graphene_once(client, f"bench:{bench.queue}:g{i}", hints)
                    c = celery_once(client, f"bench:{bench.queue}:c{i}", bench.queue)
                if i >= WARMUP:
                    graphene.append(g)
                    celery.append(c)
                if i % 10 == 0 or i == WARMUP + args.n - 1:
                    log(
                        f"{i + 1}/{WARMUP + args.n}: graphene {g['first_step_ms']:.1f} ms "
                        f"(run_start {g['run_start_ms']:.1f}, lease taken {g['acquired_ms']:.1f}); "
                        f"celery {c['exec_ms']:.1f} ms; load {load_1m():.2f}"
                    )
        finally:
            stop_workers(workers)

    def pct(rows: list[dict[str, float]], key: str, q: float) -> float:
        return percentile([r[key] for r in rows], q)

    p50, p95 = pct(graphene, "first_step_ms", 50), pct(graphene, "first_step_ms", 95)
    c50 = pct(celery, "exec_ms", 50)
    print(
        "detail: "
        f"run_start_call_p50_ms={pct(graphene, 'run_start_ms', 50):.2f} "
        f"lease_taken_p50_ms={pct(graphene, 'acquired_ms', 50):.2f} "
        f"first_step_seen_p50_ms={pct(graphene, 'seen_ms', 50):.2f} "
        f"first_step_max_ms={pct(graphene, 'first_step_ms', 100):.2f} "
        f"celery_p95_ms={pct(celery, 'exec_ms', 95):.2f} "
        f"celery_round_trip_p50_ms={pct(celery, 'round_trip_ms', 50):.2f} "
        f"n={args.n} channel_layer={args.channel_layer} load_1m={load_1m():.2f}",
        flush=True,
    )
    figures({"p50_ms": p50, "p95_ms": p95, "celery_p50_ms": c50, "ratio_vs_celery": p50 / c50})


if __name__ == "__main__":
    main()
