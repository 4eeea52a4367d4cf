"""Benchmark: how long until the work of a worker killed with SIGKILL goes on elsewhere?

Two Celery workers and ``celery beat`` run with the production lease lengths
(``GRAPHENE_OPERATION_LEASE_SECONDS=120``, ``GRAPHENE_RUN_LEASE_SECONDS=30``, see
``bench/_runs_common.py``):

* the *victim* (1 process, ``--pool`` threads x ``--concurrency`` 40) consumes the bench queue
  (threads: one process holds all 40 in flight with 41 database sessions; 40 prefork children
  would hold 80, each with its heartbeat's, more than a shared server's 100 may have free);
* the *survivor* (prefork, 1 x ``--survivor-concurrency`` 4) is started at the same time but
  consumes only an idle queue until the kill, so that every piece of work is in flight on the
  victim.

A closed gate (``kinds.testing.gate_close``) holds the work in flight: ``--records`` (20)
``test.sleep`` records whose create waits while the gate is closed, and ``--runs`` (20) runs of
``bench.gated`` whose one step does the same (``bench/_runs_pipelines.py``). Once every create
is under way (each record ``creating``) and every step has begun (each pushed a timestamp
onto a Redis list), the victim's whole process group is killed with SIGKILL, the gate is
removed (the resumed creates and steps end at once, so what is measured is the recovery, not
the work), and the survivor is told to consume the bench queue (``add_consumer``). Nothing new
is started: the messages the victim held stay unacknowledged in Redis until their visibility
timeout (an hour), so whatever resumes the work has to find it by itself.

Per piece of work, the recovery time runs from the kill to its end on the survivor: a record's
transition to ``ready`` (its event's time), a run's ``finished_at``. Every record must end with
exactly one external object (adopt-or-create: no duplicate) and every run must succeed.

    .venv/bin/python bench/recovery.py [--records 20] [--runs 20] [--pool threads] [--timeout 400]

Last line: ``records=20 runs=20 p50_s=... p95_s=... max_s=... records_p95_s=... runs_p95_s=...
load_1m_before=...``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import figures, load_1m, log, start_workers, stop_workers, wait_workers_ready
from bench._runs_common import (
    WORKER_SETTINGS,
    redis_client,
    runs_environment,
    start_beat,
    start_queue_worker,
    stop_group,
)

NAME = "recovery"


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by the nearest-rank method."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 1))))
    return ordered[rank - 1]


def wait(predicate: Any, *, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    last_log = time.monotonic()
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout:.0f}s waiting for {what}")
        if time.monotonic() - last_log > 15:
            log(f"still waiting for {what}")
            last_log = time.monotonic()
        time.sleep(interval)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=40, help="the victim's pool size")
    parser.add_argument("--pool", choices=["threads", "prefork"], default="threads", help="the victim's pool")
    parser.add_argument("--survivor-concurrency", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=400.0, help="seconds to wait for the recovery")
    args = parser.parse_args()
    if args.concurrency < args.records + args.runs:
        parser.error("--concurrency must hold every record and run in flight at once")

    victim = survivor = beat = None
    with runs_environment(NAME, redis_db=4) as bench:
        try:
            from django.db.models import Q

            from apps.pipelines.models import Run
            from apps.pipelines.services import run_start
            from apps.records import services as records
            from apps.records.choices import Phase
            from apps.records.models import Event, Record
            from graphene_project.celery import app
            from kinds.testing import gate_close, objects_of

            victim = start_workers(
                bench,
                count=1,
                concurrency=args.concurrency,
                pool=args.pool,
                extra_env={"DJANGO_SETTINGS_MODULE": WORKER_SETTINGS},
            )
            survivor = start_queue_worker(
                bench, queue=f"{bench.queue}-idle", label="survivor", concurrency=args.survivor_concurrency
            )
            log(f"workers ready in {wait_workers_ready(victim, timeout=180) + wait_workers_ready(survivor):.1f}s")
            beat = start_beat(bench)
            load_before = load_1m()

            gate = f"g{uuid.uuid4().hex[:12]}"
            closed = gate_close(gate)
            key = f"bench:{bench.queue}:steps"
            redis = redis_client(bench)

            root = records.record_ensure_root(kind="graphene.stand", name="recovery-bench")
            record_ids = [
                str(records.record_declare(kind="test.sleep", name=f"c{i}", owner=root, spec={"gate": gate}).pk)
                for i in range(args.records)
            ]
            run_ids = [
                str(run_start(pipeline_name="bench.gated", inputs={"key": key, "gate": gate}).pk)
                for _ in range(args.runs)
            ]

            def in_flight() -> bool:
                creating = Record.objects.filter(pk__in=record_ids, phase=Phase.CREATING).count()
                return creating == args.records and redis.llen(key) >= args.runs

            wait(in_flight, timeout=120, what="every create and every step to be under way on the victim")
            time.sleep(0.5)  # well inside the kinds' calls, not at their first line

            os.killpg(victim.procs[0].pid, signal.SIGKILL)
            killed_at = datetime.now(UTC)
            victim.procs[0].wait(timeout=30)
            log("victim killed (SIGKILL, whole process group)")
            closed.open()
            replies = app.control.add_consumer(bench.queue, destination=survivor.names, reply=True, timeout=10)
            if len(replies or []) != 1:
                raise RuntimeError(f"the survivor did not start consuming the bench queue: {replies}")

            def recovered() -> bool:
                ready = Record.objects.filter(pk__in=record_ids, phase=Phase.READY).count()
                done = Run.objects.filter(pk__in=run_ids).filter(~Q(finished_at=None)).count()
                return ready == args.records and done == args.runs

            wait(recovered, timeout=args.timeout, what="every record and run to recover", interval=0.1)

            failed = list(Run.objects.filter(pk__in=run_ids).exclude(status="succeeded").values_list("pk", "status"))
            if failed:
                raise RuntimeError(f"runs did not succeed after the crash: {failed}")
            duplicates = {r: len(objects_of(r)) for r in record_ids if len(objects_of(r)) != 1}
            if duplicates:
                raise RuntimeError(f"records with other than one external object: {duplicates}")
            record_s = []
            for record_id in record_ids:
                ready = (
                    Event.objects.filter(record_id=record_id, type="phase_changed", data__to=Phase.READY)
                    .order_by("id")
                    .values_list("created_at", flat=True)
                    .first()
                )
                assert ready is not None
                record_s.append((ready - killed_at).total_seconds())
            run_s = [
                (finished - killed_at).total_seconds()
                for finished in Run.objects.filter(pk__in=run_ids).values_list("finished_at", flat=True)
                if finished is not None  # every one: recovered() waited for them
            ]
        finally:
            stop_group(beat.procs[0] if beat else None)
            stop_workers(survivor)
            stop_workers(victim)

    every = record_s + run_s
    figures(
        {
            "records": len(record_s),
            "runs": len(run_s),
            "p50_s": percentile(every, 0.5),
            "max_s": max(every),
            "records_p95_s": percentile(record_s, 0.95),
            "runs_p95_s": percentile(run_s, 0.95),
            "load_1m_before": load_before,
            "p95_s": percentile(every, 0.95),
        }
    )


if __name__ == "__main__":
    main()
