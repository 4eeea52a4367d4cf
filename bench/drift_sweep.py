"""Benchmark: the drift scheduler observing 10,000 ready records of a cheap kind.

Bulk-loads (COPY) one stand owning 100 ``file`` records, each owning 100 more (10,100 file
records, ``ready``, every one due for observation), creates each record's file on disk
through the kind itself (content, mode, marker), ANALYZEs, then starts one worker process
(prefork, concurrency 1: one process executing tasks) and runs the scheduler's tick
(``records_observe_due``, what beat calls every 2 s) until every record is claimed. Time
runs from the first tick to the last ``observed_at`` written.

Checks: every record was observed once (``observed_at`` set, phase still ``ready``, no drift
events, next observation one interval ahead).

Figures:

* ``records_per_s_per_worker``: records observed per second by the one worker process
  (goal: at least 1,000);
* ``overhead_ms``: what the scheduler costs per record beyond the kind's own work — the
  worker's CPU per record plus the tick's time per record, minus ``kind_ms`` (the file
  kind's ``observe`` + ``diff`` per record, timed in this process on the same records);
* ``worker_cpu_ms``, ``scan_ms`` (the ticks), ``kind_ms`` per record.

    .venv/bin/python bench/drift_sweep.py [--fanout 100]

Last line: ``records=10100 seconds=.. records_per_s_per_worker=.. overhead_ms=.. ...``
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    analyze,
    bench_environment,
    copy_trees,
    figures,
    group_cpu_seconds,
    load_1m,
    log,
    next_tree_id,
    start_workers,
    stop_workers,
    tree_nodes,
    wait_until,
    wait_workers_ready,
)


def build(fanout: int) -> tuple[int, int]:
    """COPY the records, give each its own path, create the files. Returns (tree_id, records)."""
    from django.db import connection

    from apps.records.models import Record
    from kinds import get_kind

    tree_id = next_tree_id()
    nodes = tree_nodes((fanout, fanout))
    copy_trees(
        [(tree_id, nodes)],
        root_kind="graphene.stand",
        child_kind="file",
        child_spec={},
        phase="ready",
        name_prefix="drift",
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE records_record SET spec = jsonb_build_object('path', 'bench/' || id || '.conf',"
            " 'content', 'listen=' || lft || E'\\n', 'mode', 420),"
            " next_observe_at = now() - interval '1 second', drift_policy = 'heal'"
            " WHERE tree_id = %s AND kind = 'file'",
            [tree_id],
        )
    kind = get_kind("file")
    records = 0
    for record in Record.objects.filter(tree_id=tree_id, kind="file").iterator(chunk_size=1000):
        kind.create(record)
        records += 1
    analyze("records_record")
    return tree_id, records


def kind_ms_per_record(tree_id: int, sample: int = 1000) -> float:
    """The file kind's own observe + diff, per record, in this process."""
    from apps.records.models import Record
    from kinds import get_kind

    kind = get_kind("file")
    records = list(Record.objects.filter(tree_id=tree_id, kind="file")[:sample])
    began = time.perf_counter()
    for record in records:
        observed = kind.observe(record)
        assert observed is not None
        if kind.diff(record, observed):
            raise AssertionError(f"{record} drifted before the benchmark began")
    return (time.perf_counter() - began) * 1000 / len(records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fanout", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()

    with bench_environment("drift_sweep", redis_db=14) as bench:
        from django.db import connection
        from django.utils import timezone

        from apps.records.choices import EventType, Phase
        from apps.records.models import Event, Record
        from apps.records.services import records_observe_due

        began = time.monotonic()
        tree_id, records = build(args.fanout)
        kind_ms = kind_ms_per_record(tree_id)
        log(f"{records} file records and their files in {time.monotonic() - began:.1f}s; kind {kind_ms:.3f} ms/record")
        files = Record.objects.filter(tree_id=tree_id, kind="file")
        workers = None
        try:
            workers = start_workers(bench, count=1, concurrency=1, pool="prefork")
            wait_workers_ready(workers)
            cpu_before = group_cpu_seconds(workers)
            start_wall = time.time()
            scan_s = 0.0
            claimed = 0
            while claimed < records:
                tick = time.perf_counter()
                got = records_observe_due()
                scan_s += time.perf_counter() - tick
                claimed += got
                if not got:
                    raise AssertionError(f"a tick claimed nothing with {records - claimed} records never claimed")
            wait_until(
                lambda: not files.filter(observed_at__isnull=True).exists(),
                timeout=args.timeout,
                interval=0.05,
                what="every record observed",
            )
            cpu = group_cpu_seconds(workers) - cpu_before
        finally:
            stop_workers(workers)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT extract(epoch FROM max(observed_at)) FROM records_record WHERE tree_id = %s AND kind = 'file'",
                [tree_id],
            )
            seconds = float(cursor.fetchone()[0]) - start_wall
        now = timezone.now()
        if files.exclude(phase=Phase.READY).exists():
            raise AssertionError("a record left ready")
        if Event.objects.filter(record__tree_id=tree_id, type=EventType.DRIFT_DETECTED).exists():
            raise AssertionError("drift was detected where there was none")
        if files.filter(next_observe_at__lt=now + timedelta(seconds=30)).exists():
            raise AssertionError("a record's next observation is not one interval ahead")

    worker_ms = cpu * 1000 / records
    scan_ms = scan_s * 1000 / records
    figures(
        {
            "records": records,
            "seconds": seconds,
            "records_per_s_per_worker": records / seconds,
            "overhead_ms": worker_ms + scan_ms - kind_ms,
            "worker_cpu_ms": worker_ms,
            "scan_ms": scan_ms,
            "kind_ms": kind_ms,
            "load_1m": load_1m(),
        }
    )


if __name__ == "__main__":
    main()
