"""Benchmark: 1,000 runs waiting on records at once — do waiting runs cost workers anything?

Each run of ``bench.wait`` (``bench/_runs_pipelines.py``) declares one ``test.sleep`` record,
calls ``.ready()`` on it — the record is not ready, so the run *suspends* and its worker is
released — and, once woken, runs one step and succeeds (its record is then deleted with it).

How the records become ready 60 s later: a converging ``test.sleep`` with ``create_ms=60000``
would hold a worker process for the whole minute (1,000 of them would starve any pool), so
the records are made with ``create_ms=0`` and their *convergence is held back*: in this
benchmark ``record_converge_task`` is routed to a queue of its own
(``GRAPHENE_BENCH_CONVERGE_SEPARATELY``, see ``bench/_runs_settings.py``) that no process
consumes until the 60 s mark, when a convergence worker is started. The records therefore
stay ``pending`` (as real ones do while their kind works) and then go ready through the
normal path: ``record_converge`` → phase ``ready`` → ``runs_wake`` → the run is re-queued on
the default queue and resumes on the pool by replay. Nothing about suspension or waking is
simulated.

Phases:

1. The pool starts: ``--workers`` (2) Celery prefork workers x ``--concurrency`` (2) = 4 worker
   processes on the default queue, plus ``celery beat`` (as an installation runs it: the
   runs' and records' recovery scans are part of what waiting costs; ``--no-beat`` omits it).
2. 1,000 runs are started (``run_start`` from ``--starters`` threads); the pool executes each
   until it suspends. Wait until all 1,000 are ``suspended``.
3. The waiting window: 60 s from the moment all are suspended. Worker CPU is the increase of
   utime+stime (incl. reaped children) of every process in the pool's process groups over the
   window (``/proc/<pid>/stat``). All 1,000 must still be suspended at its end.
4. The 60 s mark: the convergence worker (1 process x 2, not part of the pool, started idle
   with the pool) is told to consume the convergence queue (``add_consumer``); the records
   become ready, the runs wake, resume on the pool and succeed. All must complete.

Peak RSS: the sum of ``VmRSS`` over the pool's processes (4 workers' parents and pool children),
sampled every 0.5 s over all phases, peak reported. RSS counts pages shared between a prefork
parent and its children in each process; the PSS sum (shared pages divided among sharers) is
printed as well.

    .venv/bin/python bench/suspended_runs.py [--runs 1000] [--wait 60] [--workers 2 --concurrency 2]

Last line: ``completed=<n> of=1000 worker_cpu_s_while_waiting=<x> peak_rss_mb=<y>``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import figures, load_1m, log, stop_workers, wait_workers_ready
from bench._runs_common import (
    MemorySampler,
    cpu_seconds,
    memory_kb,
    redis_client,
    runs_environment,
    start_beat,
    start_queue_worker,
    start_run_workers,
    stop_group,
)

NAME = "suspended_runs"


def statuses() -> Counter[str]:
    from django.db.models import Count

    from apps.pipelines.models import Run

    return Counter(dict(Run.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n")))


def start_runs(total: int, threads: int) -> list[str]:
    """``run_start`` ``total`` times from ``threads`` threads (each with its own connection)."""
    from django.db import connection

    from apps.pipelines.services import run_start

    ids: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    counter = iter(range(total))

    def starter() -> None:
        try:
            while True:
                with lock:
                    if next(counter, None) is None:
                        return
                run = run_start(pipeline_name="bench.wait", inputs={"create_ms": 0})
                with lock:
                    ids.append(str(run.pk))
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    pool = [threading.Thread(target=starter, name=f"starter-{i}") for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return ids


def wait_for(status: str, total: int, timeout: float, label: str) -> tuple[bool, float, Counter[str]]:
    """Poll run statuses every second until ``total`` runs are in ``status`` ("terminal": any
    end state). Returns (reached, seconds, counts); does not raise on timeout."""
    start = time.monotonic()
    last_log = 0.0
    while True:
        counts = statuses()
        if status == "terminal":
            reached = sum(counts[s] for s in ("succeeded", "failed", "cancelled", "timed_out"))
        else:
            reached = counts[status]
        now = time.monotonic()
        if reached >= total:
            return True, now - start, counts
        if now - start > timeout:
            log(f"{label}: gave up after {timeout:.0f}s: {dict(counts)}")
            return False, now - start, counts
        if now - last_log >= 10:
            log(f"{label}: {dict(counts)} load {load_1m():.2f}")
            last_log = now
        time.sleep(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--wait", type=float, default=60.0, help="seconds until the records become ready")
    parser.add_argument("--workers", type=int, default=2, help="pool: Celery worker processes")
    parser.add_argument("--concurrency", type=int, default=2, help="pool: prefork children per worker")
    parser.add_argument("--starters", type=int, default=4, help="threads calling run_start")
    parser.add_argument("--no-beat", action="store_true", help="no celery beat (no recovery scans)")
    parser.add_argument("--channel-layer", choices=["redis", "memory"], default="redis")
    parser.add_argument("--timeout", type=float, default=1200.0, help="per phase")
    args = parser.parse_args()

    pool = beat = converge = None
    sampler: MemorySampler | None = None
    result: dict[str, float | int] = {}
    detail: dict[str, str] = {}
    problems: list[str] = []
    with runs_environment(
        NAME, redis_db=9, channel_layer=args.channel_layer, extra={"GRAPHENE_BENCH_CONVERGE_SEPARATELY": "1"}
    ) as bench:
        converge_queue = f"{bench.queue}-converge"  # as bench/_runs_settings.py routes it

        try:
            pool = start_run_workers(bench, count=args.workers, concurrency=args.concurrency)
            log(f"pool of {args.workers}x{args.concurrency} ready in {wait_workers_ready(pool):.1f}s")
            groups = [p.pid for p in pool.procs]
            # The convergence worker starts now (outside the pool) but consumes only an idle
            # queue; at the 60 s mark it is told to consume the convergence queue as well.
            converge = start_queue_worker(bench, queue=f"{bench.queue}-idle", label="converge", concurrency=2)
            wait_workers_ready(converge)
            if not args.no_beat:
                beat = start_beat(bench)
            sampler = MemorySampler(groups).__enter__()
            idle_rss, idle_pss, procs = memory_kb(groups)
            log(f"pool idle: {procs} processes, RSS {idle_rss / 1024:.0f} MB, PSS {idle_pss / 1024:.0f} MB")

            # Phase 2: start the runs, wait until every one has suspended.
            cpu0 = cpu_seconds(groups)
            t0 = time.monotonic()
            ids = start_runs(args.runs, args.starters)
            started_s = time.monotonic() - t0
            log(f"{len(ids)} runs started in {started_s:.1f}s; converge queue {converge_queue} is not consumed")
            all_suspended, suspend_s, counts = wait_for("suspended", args.runs, args.timeout, "suspending")
            suspend_s += started_s
            if not all_suspended:
                problems.append(f"not all runs suspended: {dict(counts)}")
            cpu1 = cpu_seconds(groups)
            beat_cpu1 = cpu_seconds([beat.procs[0].pid]) if beat else 0.0
            log(
                f"{counts['suspended']} suspended {suspend_s:.1f}s after the first start; "
                f"pool CPU so far {cpu1 - cpu0:.1f}s"
            )

            # Phase 3: the waiting window.
            # The pool's CPU is also recorded per 10 s slice: beat's recovery scans show up there
            # (and records pending longer than the operation lease are re-enqueued by the
            # reconciler, which makes the window's first slice heavier after a slow set-up).
            window_end = time.monotonic() + args.wait
            slices: list[float] = []
            previous = cpu1
            while (left := window_end - time.monotonic()) > 0:
                time.sleep(min(left, 10.0))
                now_cpu = cpu_seconds(groups)
                slices.append(now_cpu - previous)
                previous = now_cpu
                if left > 10:
                    log(f"waiting: pool CPU {now_cpu - cpu1:.2f}s so far; {dict(statuses())}")
            cpu2 = cpu_seconds(groups)
            beat_cpu2 = cpu_seconds([beat.procs[0].pid]) if beat else 0.0
            still = statuses()
            if still["suspended"] != args.runs:
                problems.append(f"runs changed state while their records were pending: {dict(still)}")
            log(f"{args.wait:.0f}s of waiting: pool CPU {cpu2 - cpu1:.2f}s; the records become ready now")

            # Phase 4: converge the records; the runs wake, resume and finish.
            # Convergence messages waiting: 1 per record, plus the reconciler's re-enqueues of
            # records that stayed pending longer than GRAPHENE_OPERATION_LEASE_SECONDS.
            converge_backlog = redis_client(bench).llen(converge_queue)
            t3 = time.monotonic()
            from graphene_project.celery import app

            replies = app.control.add_consumer(converge_queue, destination=converge.names, reply=True)
            log(f"convergence worker consumes {converge_queue}: {replies}")
            _, finish_s, counts = wait_for("terminal", args.runs, args.timeout, "finishing")
            finish_s = time.monotonic() - t3
            cpu3 = cpu_seconds(groups)
            completed = counts["succeeded"]
            log(f"all ended {finish_s:.1f}s after the records' release: {dict(counts)}")
            sampler.__exit__(None, None, None)

            result = {
                "completed": completed,
                "of": args.runs,
                "worker_cpu_s_while_waiting": cpu2 - cpu1,
                "peak_rss_mb": sampler.peak_rss_kb / 1024,
            }
            detail = {
                "peak_pss_mb": f"{sampler.peak_pss_kb / 1024:.1f}",
                "pool_cpu_s_per_10s_while_waiting": ",".join(f"{x:.2f}" for x in slices),
                "converge_messages_at_release": str(converge_backlog),
                "idle_rss_mb": f"{idle_rss / 1024:.1f}",
                "pool_processes": str(sampler.peak_procs),
                "beat_cpu_s_while_waiting": f"{beat_cpu2 - beat_cpu1:.2f}" if beat else "none",
                "start_s": f"{started_s:.1f}",
                "all_suspended_s": f"{suspend_s:.1f}",
                "pool_cpu_ms_per_run_to_suspend": f"{(cpu1 - cpu0) / args.runs * 1000:.1f}",
                "finish_after_ready_s": f"{finish_s:.1f}",
                "pool_cpu_ms_per_run_to_finish": f"{(cpu3 - cpu2) / args.runs * 1000:.1f}",
                "pool": f"{args.workers}x{args.concurrency}",
                "beat": str(not args.no_beat),
                "channel_layer": args.channel_layer,
                "load_1m": f"{load_1m():.2f}",
            }
        finally:
            if sampler is not None:
                sampler.__exit__(None, None, None)
            stop_group(converge.procs[0] if converge else None)
            stop_group(beat.procs[0] if beat else None)
            stop_workers(pool)

    for problem in problems:
        log(f"PROBLEM: {problem}")
    detail["problems"] = str(len(problems))
    print("detail: " + " ".join(f"{k}={v}" for k, v in detail.items()), flush=True)
    figures(result)


if __name__ == "__main__":
    main()
