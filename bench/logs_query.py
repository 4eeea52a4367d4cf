"""Benchmark: reading logs when the installation holds 1,000,000 lines.

Bulk-loads (COPY) 10 runs, each the root of a 100-record tree (the run, 9 children, 90
grandchildren: 1,000 records in all), and 1,000 log lines per record written round-robin
across all records — as concurrent runs write them, so one record's lines are spread over
the whole table — then ANALYZEs. About one line in 200 contains the word ``timeout``.

Then measures, through the REST API in this process (Django's test client with a token:
URL routing, authentication, the query, serialization — no network):

* ``tail``: ``GET /api/v1/records/{id}/logs/?tail=500&descendants=false`` — the last 500
  lines of one record (a random record each time), what ``graphenectl logs ID --tail 500``
  asks for;
* ``run_tail``: the last 500 lines of a whole run (``tail=500``, with descendants);
* ``grep``: ``GET /api/v1/records/{run}/logs/?grep=timeout&limit=500`` — a text filter over
  one run's logs (100,000 lines), the first page of matches.

Each answer is checked (500 lines, in id order, of the right record / matching the filter).
One warm-up query each, then ``--reps`` timed ones.

    .venv/bin/python bench/logs_query.py [--reps 50] [--lines-per-record 1000]

Last line: ``lines=1000000 records=1000 tail_p50_ms=.. tail_p95_ms=.. run_tail_p95_ms=..
grep_p50_ms=.. grep_p95_ms=..`` (goal: ``tail_p95_ms`` under 100).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    analyze,
    bench_environment,
    copy_trees,
    figures,
    load_1m,
    log,
    next_tree_id,
    tree_nodes,
)
from bench._runs_common import percentile

RUNS = 10
FANOUTS = (9, 10)  # 1 + 9 + 90 = 100 records per run
WORDS = ["fetched", "compiled", "uploaded", "checked", "linked", "resolved", "cached", "pushed"]


def build(lines_per_record: int) -> tuple[list[Any], list[Any], int]:
    """COPY the runs' trees and their log lines. Returns (run ids, record ids, lines)."""
    from django.db import connection, transaction

    trees = []
    first = next_tree_id()
    for i in range(RUNS):
        trees.append((first + i, tree_nodes(FANOUTS)))
    copy_trees(
        trees, root_kind="graphene.run", child_kind="test.sleep", child_spec={}, phase="ready", name_prefix="logs"
    )
    run_ids = [nodes[0].id for _, nodes in trees]
    record_ids = [n.id for _, nodes in trees for n in nodes]
    rng = random.Random(7)
    start = datetime.now(UTC) - timedelta(hours=2)
    written = 0
    with (
        transaction.atomic(),
        connection.cursor() as wrapper,
        wrapper.cursor.copy(
            "COPY observability_logline (record_id, at, stream, severity, source, message) FROM STDIN"
        ) as copy,
    ):
        for n in range(lines_per_record):
            for record_id in record_ids:
                word = "timeout" if rng.random() < 0.005 else rng.choice(WORDS)
                severity = "warning" if word == "timeout" else "info"
                at = start + timedelta(microseconds=written * 5)
                copy.write_row(
                    (record_id, at, "stdout", severity, "run", f"step {n}: {word} item {written} in {n % 97} ms")
                )
                written += 1
            if n % 100 == 99 and record_id == record_ids[-1]:
                log(f"  {written} lines")
    analyze("observability_logline", "records_record")
    return run_ids, record_ids, written


def timed(client: Any, url: str, headers: dict[str, str]) -> tuple[float, dict[str, Any]]:
    began = time.perf_counter()
    response = client.get(url, **headers)
    elapsed = (time.perf_counter() - began) * 1000
    if response.status_code != 200:
        raise AssertionError(f"{url} answered {response.status_code}: {response.content[:300]!r}")
    return elapsed, response.json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--lines-per-record", type=int, default=1000)
    args = parser.parse_args()

    with bench_environment("logs_query", redis_db=13):
        from django.contrib.auth import get_user_model
        from django.test import Client

        from apps.accounts.services import access_token_issue
        from apps.records.models import Record

        began = time.monotonic()
        run_ids, record_ids, lines = build(args.lines_per_record)
        log(f"loaded {lines} lines over {len(record_ids)} records in {time.monotonic() - began:.1f}s")
        user = get_user_model().objects.create_superuser("bench", password=None)
        headers = {"HTTP_AUTHORIZATION": f"Token {access_token_issue(user=user).key}", "HTTP_HOST": "localhost"}
        client = Client()
        rng = random.Random(11)
        leaves = list(
            Record.objects.filter(pk__in=record_ids).exclude(kind="graphene.run").values_list("pk", flat=True)
        )

        def tail(record_id: Any, descendants: bool) -> float:
            query = "tail=500" + ("" if descendants else "&descendants=false")
            ms, body = timed(client, f"/api/v1/records/{record_id}/logs/?{query}", headers)
            got = body["results"]
            want = min(500, args.lines_per_record * (100 if descendants else 1))
            if len(got) != want or [g["id"] for g in got] != sorted(g["id"] for g in got):
                raise AssertionError(f"tail of {record_id}: {len(got)} lines, not {want} in id order")
            if not descendants and {g["record"] for g in got} != {str(record_id)}:
                raise AssertionError(f"tail of {record_id} holds other records' lines")
            return ms

        def grep(run_id: Any) -> float:
            ms, body = timed(client, f"/api/v1/records/{run_id}/logs/?grep=timeout&limit=500", headers)
            got = body["results"]
            if not got or not all("timeout" in g["message"] for g in got):
                raise AssertionError(f"grep over run {run_id} found {len(got)} lines, or lines without the text")
            return ms

        tail(leaves[0], False), tail(run_ids[0], True), grep(run_ids[0])  # warm-up
        tails = [tail(rng.choice(leaves), False) for _ in range(args.reps)]
        run_tails = [tail(rng.choice(run_ids), True) for _ in range(args.reps)]
        greps = [grep(rng.choice(run_ids)) for _ in range(args.reps)]

    figures(
        {
            "lines": lines,
            "records": len(record_ids),
            "tail_p50_ms": percentile(tails, 50),
            "tail_p95_ms": percentile(tails, 95),
            "run_tail_p50_ms": percentile(run_tails, 50),
            "run_tail_p95_ms": percentile(run_tails, 95),
            "grep_p50_ms": percentile(greps, 50),
            "grep_p95_ms": percentile(greps, 95),
            "load_1m": load_1m(),
        }
    )


if __name__ == "__main__":
    main()
