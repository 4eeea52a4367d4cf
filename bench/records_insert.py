"""Benchmark: does declaring records cost the same in a small and in a big installation?

Declares 1,000 ``test.sleep`` records into one fresh run's tree through ``record_declare``
(the real service: tree lock, mptt insert, ``declared`` event, convergence enqueued on
commit) when the installation already holds 1,000 records and again when it holds 100,000.
Each run being a separate mptt tree (DESIGN.md, Records), the ratio must stay under 1.5.

Two shapes of the 1,000 declarations:

* ``flat``: 1,000 children of the run;
* ``nested``: 10 groups under the run, then 99 children under each, declared round-robin
  across the groups (as parallel pipeline branches would), so most inserts go under an
  owner left of the tree's right edge: with dense nested sets each would move the bounds of
  the other groups' subtrees (the free numbers of ``Record.tree_slack`` make that rare).

No worker runs: convergence messages go to this benchmark's own queue (in its own Redis
db) and are dropped after each repetition. The filler installation is bulk-loaded with
COPY as separate trees (runs and stands, 100 records each: root, 9 children, 90
grandchildren; one ``declared`` event per record) and ANALYZEd. Each repetition uses a fresh
run, hard-deleted afterwards so the installation size stays what it says; one warm-up, then
the median of ``--reps`` repetitions.

    .venv/bin/python bench/records_insert.py [--reps 5] [--small 1000] [--big 100000]

Last line: ``declare_1k_ms_at_1k=.. declare_1k_ms_at_100k=.. per_record_ms_at_100k=..
per_record_ms=.. nested_per_record_ms=.. ratio_100k_vs_1k=.. nested_... queries_per_declare=..``
(``per_record_ms`` and ``nested_per_record_ms``: one declaration, flat and nested, at 100,000
installed records).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if TYPE_CHECKING:
    from apps.records.models import Record

from bench._common import (
    Bench,
    analyze,
    bench_environment,
    copy_trees,
    figures,
    load_1m,
    log,
    median,
    next_tree_id,
    process_cpu_seconds,
    tree_nodes,
    use_database,
)

FILLER_SHAPE = (9, 10)  # 1 + 9 + 90 = 100 records per filler tree
FILLER_TREE_SIZE = 100
DECLARATIONS = 1000
NESTED_GROUPS = 10
SPEC = {"create_ms": 0, "delete_ms": 0}


def installation_size() -> int:
    from apps.records.models import Record

    return Record.objects.count()


def fill_to(target: int) -> None:
    """Add filler trees until the installation holds ``target`` records."""
    missing = target - installation_size()
    trees = missing // FILLER_TREE_SIZE
    if trees <= 0:
        return
    start = time.monotonic()
    first = next_tree_id()
    batch = 200
    for offset in range(0, trees, batch):
        chunk = [(first + offset + i, tree_nodes(FILLER_SHAPE)) for i in range(min(batch, trees - offset))]
        # Half runs, half stands: both are roots of their own trees.
        runs = [t for t in chunk if t[0] % 2 == 0]
        stands = [t for t in chunk if t[0] % 2 == 1]
        for root_kind, group in (("graphene.run", runs), ("graphene.stand", stands)):
            if group:
                copy_trees(
                    group,
                    root_kind=root_kind,
                    child_kind="test.sleep",
                    child_spec=SPEC,
                    phase="ready",
                    name_prefix="filler",
                )
    analyze("records_record", "records_event")
    log(f"filled to {installation_size()} records in {time.monotonic() - start:.1f}s")


def drop_tree(tree_id: int) -> None:
    """Hard-delete a measurement tree (and its events) so the installation size stays put."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM records_event WHERE record_id IN (SELECT id FROM records_record WHERE tree_id = %s)",
            [tree_id],
        )
        cursor.execute("DELETE FROM records_record WHERE tree_id = %s", [tree_id])


def declare_flat(run: Record) -> None:
    from apps.records.services import record_declare

    for i in range(DECLARATIONS):
        record_declare(kind="test.sleep", name=f"r{i}", owner=run, spec=SPEC)


def declare_nested(run: Record) -> None:
    from apps.records.services import record_declare

    groups = [record_declare(kind="test.sleep", name=f"g{g}", owner=run, spec=SPEC) for g in range(NESTED_GROUPS)]
    per_group = (DECLARATIONS - NESTED_GROUPS) // NESTED_GROUPS
    for i in range(per_group):
        for g, group in enumerate(groups):
            record_declare(kind="test.sleep", name=f"r{g}-{i}", owner=group, spec=SPEC)


SHAPES = {"flat": declare_flat, "nested": declare_nested}


@dataclass
class Sample:
    wall_ms: float
    cpu_ms: float  # this process + its PostgreSQL backend
    queries: int


def declare_once(bench: Bench, shape: str, name: str, *, count_queries: bool) -> Sample:
    """Declare the 1,000 records into a fresh run, check the result, then remove the run."""
    import redis
    from django.db import connection

    from apps.records.models import Record
    from apps.records.services import record_create_root

    run = record_create_root(kind="graphene.run", name=name)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    counter = QueryCounter()
    cpu0 = time.process_time() + process_cpu_seconds(backend)
    start = time.perf_counter()
    with counter if count_queries else contextlib.nullcontext():
        SHAPES[shape](run)
    wall = (time.perf_counter() - start) * 1000
    cpu = (time.process_time() + process_cpu_seconds(backend) - cpu0) * 1000

    count = Record.objects.filter(tree_id=run.tree_id).count() - 1
    if count != DECLARATIONS:
        raise AssertionError(f"{shape}: expected {DECLARATIONS} records in the run's tree, found {count}")
    broker = redis.Redis.from_url(bench.broker_url)
    queued = broker.llen(bench.queue)
    if queued < DECLARATIONS:
        raise AssertionError(f"{shape}: expected {DECLARATIONS} convergence messages, found {queued}")
    check_tree(run.tree_id)
    broker.delete(bench.queue)
    drop_tree(run.tree_id)
    return Sample(wall, cpu, counter.count)


class QueryCounter:
    """Counts the SQL statements sent through Django (BEGIN/COMMIT are not statements here)."""

    def __init__(self) -> None:
        self.count = 0
        self._cm: contextlib.AbstractContextManager[None] | None = None

    def _wrapper(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.count += 1
        return execute(sql, params, many, context)

    def __enter__(self) -> QueryCounter:
        from django.db import connection

        self._cm = connection.execute_wrapper(self._wrapper)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._cm is not None
        self._cm.__exit__(*exc)


def check_tree(tree_id: int) -> None:
    """The mptt columns the inserts produced are a consistent nesting (guards the benchmark
    against measuring a fast but broken insert path)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FROM records_record c JOIN records_record p ON p.id = c.parent_id
            WHERE c.tree_id = %s AND NOT (p.tree_id = c.tree_id AND p.lft < c.lft AND c.rght < p.rght
                                          AND c.level = p.level + 1)
            """,
            [tree_id],
        )
        bad = cursor.fetchone()[0]
        # Siblings apart, and a record's free numbers (tree_slack) after its last child.
        cursor.execute(
            """
            SELECT count(*) FROM records_record a JOIN records_record b
              ON b.parent_id = a.parent_id AND b.id <> a.id AND a.lft < b.lft AND b.lft < a.rght
            WHERE a.tree_id = %s
            """,
            [tree_id],
        )
        bad += cursor.fetchone()[0]
        cursor.execute(
            """
            SELECT count(*) FROM records_record c JOIN records_record p ON p.id = c.parent_id
            WHERE c.tree_id = %s AND c.rght >= p.rght - p.tree_slack
            """,
            [tree_id],
        )
        bad += cursor.fetchone()[0]
        # No number used twice, the root first (free numbers make them not exactly 1..2n).
        cursor.execute(
            """
            SELECT count(*) / 2, min(v), count(DISTINCT v)
            FROM (SELECT lft AS v FROM records_record WHERE tree_id = %s
                  UNION ALL SELECT rght FROM records_record WHERE tree_id = %s) AS bounds
            """,
            [tree_id, tree_id],
        )
        n, lo, distinct = cursor.fetchone()
    if bad or lo != 1 or distinct != 2 * n:
        raise AssertionError(f"tree {tree_id} has inconsistent mptt columns: {bad} bad edges, {n=} {lo=} {distinct=}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--big", type=int, default=100_000)
    args = parser.parse_args()

    load = load_1m()
    with bench_environment("records_insert", redis_db=10) as bench:
        # Two installations side by side, one database each, and the repetitions alternate
        # between them: a burst of other load on the machine then hits both cases alike.
        databases = {"small": bench.db_name, "big": f"{bench.db_name}_big"}
        sizes = {"small": args.small, "big": args.big}
        for label in ("big", "small"):
            use_database(databases[label], migrate=label == "big")
            fill_to(sizes[label])
            sizes[label] = installation_size()
        samples: dict[tuple[str, str], list[Sample]] = {}
        for rep in range(args.reps + 1):  # rep 0 is a warm-up (and counts the queries)
            for shape in SHAPES:
                for label in ("small", "big"):
                    use_database(databases[label])
                    sample = declare_once(bench, shape, f"bench-{shape}-{rep}", count_queries=rep == 0)
                    log(
                        f"{shape:6} at {sizes[label]:>6} records: rep {rep}: {sample.wall_ms:7.0f} ms wall,"
                        f" {sample.cpu_ms:7.0f} ms cpu" + (" (warm-up)" if rep == 0 else "")
                    )
                    samples.setdefault((shape, label), []).append(sample)
        for label in ("small", "big"):
            use_database(databases[label])
            if installation_size() != sizes[label]:
                raise AssertionError("the measurement trees were not removed")

    def wall(shape: str, label: str) -> float:
        return median([x.wall_ms for x in samples[shape, label][1:]])

    def cpu(shape: str, label: str) -> float:
        return median([x.cpu_ms for x in samples[shape, label][1:]])

    figures(
        {
            "records_small": sizes["small"],
            "records_big": sizes["big"],
            "declare_1k_ms_at_1k": wall("flat", "small"),
            "declare_1k_ms_at_100k": wall("flat", "big"),
            "per_record_ms_at_100k": wall("flat", "big") / DECLARATIONS,
            "per_record_ms": wall("flat", "big") / DECLARATIONS,
            "nested_per_record_ms": wall("nested", "big") / DECLARATIONS,
            "ratio_100k_vs_1k": wall("flat", "big") / wall("flat", "small"),
            "cpu_ratio_100k_vs_1k": cpu("flat", "big") / cpu("flat", "small"),
            "nested_declare_1k_ms_at_1k": wall("nested", "small"),
            "nested_declare_1k_ms_at_100k": wall("nested", "big"),
            "nested_ratio_100k_vs_1k": wall("nested", "big") / wall("nested", "small"),
            "nested_cpu_ratio_100k_vs_1k": cpu("nested", "big") / cpu("nested", "small"),
            "queries_per_declare": samples["flat", "big"][0].queries / DECLARATIONS,
            "reps": args.reps,
            "load_1m_before": load,
        }
    )


if __name__ == "__main__":
    main()
