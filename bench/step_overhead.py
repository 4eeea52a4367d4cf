"""Benchmark: what does one checkpointed step cost, against DBOS Transact on the same PostgreSQL?

Graphene: a run of the pipeline ``bench.steps`` (``bench/_runs_pipelines.py``): 200
``ctx.step`` calls; the first and the last step return ``time.time()`` taken when they
execute, the 198 between are no-ops. One Celery worker process (prefork, concurrency 1) on
this benchmark's own queue, database and Redis db.

DBOS: the same shape in DBOS Transact (the ``dbos`` package), a ``@DBOS.workflow()`` calling
200 ``@DBOS.step()`` functions, executed in this process against its own database on the same
PostgreSQL server.

**Per-step overhead** = (time the last step executed - time the first step executed) / 199.
Between those two moments lie exactly 199 complete step cycles, each: journal the previous
step's result (one committed write), dispatch the next call, execute it. The steps do nothing,
so that is all overhead. Start-up (dequeue, lease, loading the journal) and the end of the run
are outside the window, in both systems, so the figure does not depend on how many steps a
run has. Both clocks are the same machine's wall clock, read inside the step functions.

Runs are interleaved (Graphene, DBOS, Graphene, ...) so that a load change on the machine
hits both alike; one warm-up run of each is discarded, then the median of ``--runs`` (5).

    .venv/bin/python bench/step_overhead.py [--runs 5] [--steps 200]

Last line: ``graphene_step_ms=<x> dbos_step_ms=<y> ratio_vs_dbos=<x/y>`` (``nan`` for DBOS
if it cannot be imported or run here; the reason is printed above).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    Bench,
    figures,
    load_1m,
    log,
    median,
    recreate_database,
    stop_workers,
    wait_until,
    wait_workers_ready,
)
from bench._runs_common import runs_environment, start_run_workers

NAME = "step_overhead"


# --- Graphene ----------------------------------------------------------------------------------


def graphene_once(steps: int) -> dict[str, float]:
    """One run of ``bench.steps``; per-step ms from the step-reported times (and the journal)."""
    from apps.pipelines.choices import TERMINAL
    from apps.pipelines.models import JournalEntry, Run
    from apps.pipelines.services import run_start

    run = run_start(pipeline_name="bench.steps", inputs={"steps": steps})
    wait_until(
        lambda: Run.objects.filter(pk=run.pk, status__in=list(TERMINAL)).exists(),
        timeout=300,
        interval=0.02,
        what=f"run {run.pk} to finish",
    )
    run.refresh_from_db()
    if run.status != "succeeded":
        raise RuntimeError(f"run {run.pk} ended {run.status}: {run.error}")
    entries = list(JournalEntry.objects.filter(run=run).order_by("seq"))
    if len(entries) != steps:
        raise RuntimeError(f"run {run.pk} journaled {len(entries)} calls, expected {steps}")
    first, last = entries[0], entries[-1]
    t_first, t_last = float((first.result or {})["value"]), float((last.result or {})["value"])
    assert last.completed_at is not None
    assert run.started_at is not None
    assert run.finished_at is not None
    return {
        "step_ms": (t_last - t_first) / (steps - 1) * 1000,
        # Cross-check from the journal: the first entry is written when step 1 completes, the
        # last when step ``steps`` completes: ``steps - 1`` cycles between them as well.
        "journal_step_ms": (last.completed_at - first.created_at).total_seconds() / (steps - 1) * 1000,
        "run_s": (run.finished_at - run.started_at).total_seconds(),
    }


# --- DBOS --------------------------------------------------------------------------------------


class Dbos:
    """DBOS Transact in this process, with its system database on the same PostgreSQL server."""

    def __init__(self, bench: Bench) -> None:
        self.db_name = f"graphene_bench_{NAME}_dbos"
        self.url = bench.database_url.rsplit("/", 1)[0] + f"/{self.db_name}"
        self.dbos: Any = None
        self.workflow: Callable[[int], tuple[float, float]] | None = None
        self.version = ""

    def start(self) -> None:
        from importlib.metadata import version

        from dbos import DBOS

        self.version = version("dbos")
        recreate_database(self.db_name)
        self.dbos = DBOS(config={"name": "graphene-bench", "system_database_url": self.url, "log_level": "WARNING"})

        @DBOS.step()
        def noop() -> None:
            return None

        @DBOS.step()
        def stamp() -> float:
            return time.time()

        @DBOS.workflow()
        def steps_workflow(steps: int) -> tuple[float, float]:
            t_first = stamp()
            for _ in range(steps - 2):
                noop()
            t_last = stamp()
            return t_first, t_last

        self.workflow = steps_workflow
        DBOS.launch()

    def once(self, steps: int) -> dict[str, float]:
        assert self.workflow is not None
        started = time.monotonic()
        t_first, t_last = self.workflow(steps)
        return {"step_ms": (t_last - t_first) / (steps - 1) * 1000, "run_s": time.monotonic() - started}

    def stop(self) -> None:
        if self.dbos is not None:
            from dbos import DBOS

            with contextlib.suppress(Exception):
                DBOS.destroy()


# --- main --------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--no-dbos", action="store_true", help="skip DBOS (ratio_vs_dbos=nan)")
    parser.add_argument(
        "--channel-layer",
        choices=["redis", "memory"],
        default="redis",
        help="run/record notifications through Redis as in production (default) or in memory as in the tests",
    )
    args = parser.parse_args()

    graphene: list[dict[str, float]] = []
    dbos_results: list[dict[str, float]] = []
    dbos_error = "skipped (--no-dbos)" if args.no_dbos else ""
    workers = None
    dbos: Dbos | None = None
    with runs_environment(NAME, redis_db=7, channel_layer=args.channel_layer) as bench:
        try:
            workers = start_run_workers(bench, count=1, concurrency=1)
            log(f"worker ready in {wait_workers_ready(workers):.1f}s")
            if not args.no_dbos:
                dbos = Dbos(bench)
                try:
                    dbos.start()
                    log(f"DBOS {dbos.version} launched (system database {dbos.db_name})")
                except Exception as exc:
                    dbos_error = f"DBOS could not be started: {type(exc).__name__}: {exc}"
                    log(dbos_error + "\n" + traceback.format_exc())
                    dbos.stop()
                    dbos = None
            for i in range(args.runs + 1):
                label = "warm-up" if i == 0 else f"run {i}/{args.runs}"
                g = graphene_once(args.steps)
                line = (
                    f"{label}: graphene {g['step_ms']:.3f} ms/step "
                    f"(journal {g['journal_step_ms']:.3f}, run {g['run_s']:.2f}s)"
                )
                if i:
                    graphene.append(g)
                if dbos is not None:
                    try:
                        d = dbos.once(args.steps)
                    except Exception as exc:
                        dbos_error = f"a DBOS workflow failed: {type(exc).__name__}: {exc}"
                        log(dbos_error + "\n" + traceback.format_exc())
                        dbos.stop()
                        dbos = None
                    else:
                        line += f"; dbos {d['step_ms']:.3f} ms/step (run {d['run_s']:.2f}s)"
                        if i:
                            dbos_results.append(d)
                log(line + f"; load {load_1m():.2f}")
        finally:
            if dbos is not None:
                dbos.stop()
            stop_workers(workers)

    g_ms = median([g["step_ms"] for g in graphene])
    d_ms = median([d["step_ms"] for d in dbos_results]) if len(dbos_results) == args.runs else math.nan
    if dbos_error:
        log(dbos_error)
    ratio = g_ms / d_ms if d_ms and not math.isnan(d_ms) else math.nan
    g_all = ",".join(f"{g['step_ms']:.3f}" for g in graphene)
    d_all = ",".join(f"{d['step_ms']:.3f}" for d in dbos_results) or "none"
    d_run = median([d["run_s"] for d in dbos_results]) if dbos_results else math.nan
    print(
        "detail: "
        f"graphene_step_ms_all={g_all} "
        f"graphene_journal_step_ms={median([g['journal_step_ms'] for g in graphene]):.3f} "
        f"graphene_run_s={median([g['run_s'] for g in graphene]):.3f} "
        f"dbos_step_ms_all={d_all} dbos_run_s={d_run:.3f} "
        f"steps={args.steps} runs={args.runs} channel_layer={args.channel_layer} load_1m={load_1m():.2f}",
        flush=True,
    )
    figures({"graphene_step_ms": g_ms, "dbos_step_ms": d_ms, "ratio_vs_dbos": ratio})


if __name__ == "__main__":
    main()
