"""Benchmark: cascade deletion throughput of a big tree with real Celery worker processes.

Builds one ``graphene.run`` root owning a ``test.sleep`` tree of fan-out 10 and depth 4
(10 + 100 + 1,000 + 10,000 = 11,110 records, 0 ms delete), all ``ready`` and each with its
external object in the test world (``GRAPHENE_TEST_WORLD_DIR/<record id>/<object>``). The
tree is bulk-loaded with COPY (correct mptt columns, one ``declared`` event per record).

The test world lives in memory (``/dev/shm``) unless ``--world disk``: its objects are
files, and removing the tree's 11,110 folders (a file each) took 1.1-1.3 s on this machine's
ext4, about 0.1 ms a folder whether one process or two did it (measured alone, without
Graphene), against 0.16 s in ``/dev/shm``: the stand-in's cost, not Graphene's, for a kind
whose delete takes 0 ms.

Then starts the Celery workers (own queue, own Redis db), waits until they answer a ping,
warms them up on a small separate tree, calls ``record_delete_request`` on the root and
polls the database until every record of the tree is ``deleted``. The time is measured from
just before the request to the last ``deleted_at`` written (so the polling interval does not
count).

Checks, which fail the benchmark if violated:

* every record is ``deleted`` with ``deleted_at`` set, and no delete failed;
* children before parents, by time: for every record, ``deleted_at`` >= every child's;
* children before parents, by event order: a parent's ``deleting`` transition (its kind's
  delete starting) has a higher event id than every child's ``deleted`` transition;
* every external object is gone from the test world.

    .venv/bin/python bench/cascade_delete.py [--pool prefork|threads|solo] [--workers 1] [--concurrency 2]
                                             [--fanout 10] [--depth 4] [--timeout 600] [--world memory|disk]

``--workers`` is the number of ``celery worker`` processes, ``--concurrency`` the pool size of
each: ``--workers 1 --concurrency 2 --pool prefork`` is one worker with two processes
executing tasks; ``--workers 2 --concurrency 1`` is two workers with one each.

Last line: ``records=11111 seconds=.. records_per_s=.. workers=.. children_first=ok ...``
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    Bench,
    Node,
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

SPEC = {"create_ms": 0, "delete_ms": 0}


def build_tree(bench: Bench, fanouts: tuple[int, ...], name: str) -> tuple[int, uuid.UUID, int]:
    """COPY a run-rooted tree of ``ready`` test.sleep records and create each record's external
    object the way the kind does. Returns (tree_id, root id, records)."""
    tree_id = next_tree_id()
    nodes = tree_nodes(fanouts)
    copy_trees(
        [(tree_id, nodes)],
        root_kind="graphene.run",
        child_kind="test.sleep",
        child_spec=SPEC,
        phase="ready",
        name_prefix=name,
    )
    make_world_objects(nodes[1:])
    if world_objects_left(tree_id) != len(nodes) - 1:
        raise AssertionError("the test world does not hold one object per record")
    return tree_id, nodes[0].id, len(nodes)


def make_world_objects(nodes: list[Node]) -> None:
    """Create each record's external object through the kind itself (as convergence would),
    so the benchmark does not depend on how the test world lays out its files."""
    from apps.records.models import Record
    from kinds import get_kind

    kind = get_kind("test.sleep")
    for node in nodes:
        kind.create(Record(id=node.id, kind=kind.name, spec=SPEC))


def world_objects_left(tree_id: int) -> int:
    """External objects still present for the tree's records (the test world's own count)."""
    from apps.records.models import Record
    from kinds.testing import objects_of

    ids = Record.objects.filter(tree_id=tree_id).values_list("pk", flat=True)
    return sum(len(objects_of(str(pk))) for pk in ids)


def live_count(tree_id: int) -> int:
    from apps.records.models import Record

    return Record.objects.filter(tree_id=tree_id).exclude(phase="deleted").count()


def delete_and_wait(tree_id: int, root_id: uuid.UUID, *, timeout: float) -> tuple[float, float]:
    """Request deletion of the root; return (seconds to the last deletion, request ms)."""
    from django.db import connection

    from apps.records.models import Record
    from apps.records.services import record_delete_request

    root = Record.objects.get(pk=root_id)
    start_wall = time.time()
    start = time.perf_counter()
    record_delete_request(record=root)
    request_ms = (time.perf_counter() - start) * 1000
    last_report = [time.monotonic()]

    def done() -> bool:
        left = live_count(tree_id)
        if time.monotonic() - last_report[0] > 5:
            log(f"  {left} records not deleted yet")
            last_report[0] = time.monotonic()
        return left == 0

    wait_until(done, timeout=timeout, interval=0.1, what=f"deletion of tree {tree_id}")
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM max(deleted_at)) FROM records_record WHERE tree_id = %s", [tree_id])
        last = float(cursor.fetchone()[0])
    return last - start_wall, request_ms


def verify(bench: Bench, tree_id: int, records: int) -> dict[str, object]:
    """The correctness checks; raises AssertionError with the details on a violation."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), count(*) FILTER (WHERE phase = 'deleted' AND deleted_at IS NOT NULL)"
            " FROM records_record WHERE tree_id = %s",
            [tree_id],
        )
        total, deleted = cursor.fetchone()
        # Time order: a parent is deleted no earlier than any of its children.
        cursor.execute(
            """
            SELECT count(*) FROM records_record c JOIN records_record p ON p.id = c.parent_id
            WHERE c.tree_id = %s AND NOT (p.deleted_at >= c.deleted_at)
            """,
            [tree_id],
        )
        time_violations = cursor.fetchone()[0]
        # Event order (clock-free): the parent's kind delete starts (``deleting``) after every
        # child reached ``deleted``.
        cursor.execute(
            """
            WITH ev AS (
                SELECT e.record_id,
                       min(e.id) FILTER (WHERE e.data->>'to' = 'deleting') AS deleting_id,
                       max(e.id) FILTER (WHERE e.data->>'to' = 'deleted') AS deleted_id
                FROM records_event e JOIN records_record r ON r.id = e.record_id
                WHERE r.tree_id = %s AND e.type = 'phase_changed'
                GROUP BY e.record_id
            )
            SELECT count(*) FILTER (WHERE p.deleting_id IS NULL OR c.deleted_id IS NULL OR p.deleting_id < c.deleted_id)
            FROM records_record r
            JOIN ev c ON c.record_id = r.id
            JOIN ev p ON p.record_id = r.parent_id
            WHERE r.tree_id = %s
            """,
            [tree_id, tree_id],
        )
        order_violations = cursor.fetchone()[0]
        cursor.execute(
            """
            SELECT count(*) FILTER (WHERE e.type = 'error'),
                   count(*) FILTER (WHERE e.type = 'phase_changed' AND e.data->>'to' = 'delete_failed')
            FROM records_event e JOIN records_record r ON r.id = e.record_id WHERE r.tree_id = %s
            """,
            [tree_id],
        )
        errors, failed = cursor.fetchone()
    left = world_objects_left(tree_id)
    problems = []
    if total != records or deleted != records:
        problems.append(f"{deleted} of {total} records deleted (expected {records})")
    if time_violations:
        problems.append(f"{time_violations} parents have deleted_at before one of their children")
    if order_violations:
        problems.append(
            f"{order_violations} parent/child pairs where the parent's delete began before the child was deleted"
        )
    if errors or failed:
        problems.append(f"{errors} error events, {failed} delete_failed transitions")
    if left:
        problems.append(f"{left} external objects left in the test world")
    if problems:
        raise AssertionError("; ".join(problems))
    return {"children_first": "ok", "event_order": "ok", "objects_left": left, "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pool", default="prefork", choices=["prefork", "threads", "solo", "gevent", "eventlet"])
    parser.add_argument("--workers", type=int, default=1, help="celery worker processes")
    parser.add_argument("--concurrency", type=int, default=2, help="pool size of each worker")
    parser.add_argument("--fanout", type=int, default=10)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the deletion")
    parser.add_argument(
        "--world",
        default="memory",
        choices=["memory", "disk"],
        help="where the test world's files are: /dev/shm (if there is one) or the temporary directory",
    )
    args = parser.parse_args()
    fanouts = (args.fanout,) * args.depth
    memory = "/dev/shm"
    world = "memory" if args.world == "memory" and Path(memory).is_dir() else "disk"

    with bench_environment("cascade_delete", redis_db=11, data_parent=memory if world == "memory" else None) as bench:
        build_start = time.monotonic()
        tree_id, root_id, records = build_tree(bench, fanouts, "cascade")
        warm_tree, warm_root, warm_records = build_tree(bench, (4, 5), "warmup")
        analyze("records_record", "records_event")
        log(f"built {records} + {warm_records} records in {time.monotonic() - build_start:.1f}s")

        workers = None
        try:
            workers = start_workers(bench, count=args.workers, concurrency=args.concurrency, pool=args.pool)
            ready_s = wait_workers_ready(workers, timeout=60)
            log(f"{args.workers} worker(s) ({args.pool} x{args.concurrency}) ready in {ready_s:.1f}s")
            # Warm-up: every pool process opens its connection and imports what it needs.
            delete_and_wait(warm_tree, warm_root, timeout=60)
            verify(bench, warm_tree, warm_records)
            log("warm-up deletion done; deleting the big tree")
            load = load_1m()
            cpu_before = group_cpu_seconds(workers)
            seconds, request_ms = delete_and_wait(tree_id, root_id, timeout=args.timeout)
            worker_cpu = group_cpu_seconds(workers) - cpu_before
        except BaseException:
            if workers is not None:
                log("worker log tail:\n" + workers.tail())
            raise
        finally:
            stop_workers(workers)
        checks = verify(bench, tree_id, records)

    executing = args.workers * (args.concurrency if args.pool in ("prefork",) else 1)
    figures(
        {
            "records": records,
            "seconds": seconds,
            "records_per_s": records / seconds,
            "workers": executing,
            "celery_workers": args.workers,
            "pool": args.pool,
            "concurrency": args.concurrency,
            "request_ms": request_ms,
            "worker_cpu_ms_per_record": worker_cpu * 1000 / records,
            **checks,
            "world": world,
            "load_1m_before": load,
        }
    )


if __name__ == "__main__":
    main()
