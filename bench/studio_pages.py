"""Benchmark: the Studio's pages with a big installation behind them.

Bulk-loads (COPY) 10,000 runs of the test pipelines (``tests/pipelines/sample.py``), each
the root of a 10-record tree (100,000 records), with their status histories and journals
(three events and ten calls a run), 1,000,000 log lines spread over the records, and 20
stands holding 10 records each; then ANALYZEs. Statuses are what a real installation has:
most runs ended (succeeded, some failed or cancelled), a few running, suspended or queued.

Then requests every Studio page type as a logged-in superuser, through Django's test client
in this process (routing, the session, the admin's frame, the queries, the templates — no
network): the home page, the runs list (all, and filtered), a run's page (a random run each
time), the pipelines list, a pipeline's page with its start form, the stands page, the
agents board (50 agents declared through the services, each with two capabilities), the
artifacts list, a run's topology, the records list (the trees, and filtered), a record's
inspector on each of its tabs (a random run's root each time) and the confirmation page of
its deletion. One
warm-up request each, then ``--reps`` timed ones; the query count of each page is taken once.

    .venv/bin/python bench/studio_pages.py [--reps 30] [--runs 10000]

Last line: ``<page>_p95_ms=..`` for each page, then ``worst_p95_ms=.. max_queries=..``
(goal: every page under 300 ms p95, and a page's queries do not grow with its rows).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import analyze, bench_environment, copy_trees, figures, load_1m, log, next_tree_id, tree_nodes
from bench._runs_common import percentile

FANOUT = (9,)  # a run and nine records: ten records a run
PIPELINES = ["sample.tree", "sample.wait", "sample.step", "sample.studio", "sample.form"]
STATUSES = [("succeeded", 0.8), ("failed", 0.1), ("cancelled", 0.05), ("running", 0.02), ("suspended", 0.02)]
LOG_LINES = 1_000_000
STANDS, HOLDINGS = 20, 10
AGENTS = 50  # agent records, each with two capabilities (the agents board)


def _status(rng: random.Random) -> str:
    roll, total = rng.random(), 0.0
    for status, share in STATUSES:
        total += share
        if roll < total:
            return status
    return "queued"


def build(runs: int) -> dict[str, Any]:
    """COPY the installation. Returns what the timed requests pick from."""
    from django.db import connection, transaction

    from apps.pipelines import services

    pipelines = {p.name: p for p in (services.pipeline_sync(services.definition_get(n)) for n in PIPELINES)}
    rng = random.Random(5)
    first = next_tree_id()
    trees = [(first + i, tree_nodes(FANOUT)) for i in range(runs)]
    copy_trees(
        trees, root_kind="graphene.run", child_kind="test.sleep", child_spec={}, phase="ready", name_prefix="run"
    )
    stand_trees = [(first + runs + i, tree_nodes((HOLDINGS,))) for i in range(STANDS)]
    copy_trees(
        stand_trees, root_kind="graphene.stand", child_kind="test.sleep", child_spec={}, phase="ready", name_prefix="s"
    )
    now = datetime.now(UTC)
    numbers: dict[str, int] = {}
    run_rows: list[tuple[Any, ...]] = []
    for _tree_id, nodes in trees:
        name = rng.choice(PIPELINES)
        numbers[name] = numbers.get(name, 0) + 1
        status = _status(rng)
        created = now - timedelta(seconds=rng.uniform(0, 30 * 86400))
        started = created + timedelta(seconds=rng.uniform(0.01, 2))
        ended = status in ("succeeded", "failed", "cancelled")
        finished = started + timedelta(seconds=rng.uniform(1, 600)) if ended else None
        waiting = [str(nodes[1].id)] if status == "suspended" else []
        run_rows.append(
            (
                nodes[0].id,
                created,
                finished or started,
                pipelines[name].pk,
                numbers[name],
                nodes[0].id,
                status,
                json.dumps({}),
                json.dumps(None),
                "Traceback (most recent call last):\n  ...\nStepFailed: boom" if status == "failed" else "",
                1,
                json.dumps(waiting),
                started,
                finished,
            )
        )
    with transaction.atomic(), connection.cursor() as wrapper:
        cursor = wrapper.cursor
        columns = (
            "id, created_at, updated_at, pipeline_id, number, record_id, status, inputs, outputs, error, attempt, "
            "waiting_on, started_at, finished_at"
        )
        with cursor.copy(f"COPY pipelines_run ({columns}) FROM STDIN") as copy:
            for row in run_rows:
                copy.write_row(row)
        with cursor.copy(
            "COPY pipelines_runevent (run_id, from_status, to_status, reason, message, data, created_at) FROM STDIN"
        ) as copy:
            for row in run_rows:
                run_id, created, status, started = row[0], row[1], row[6], row[12]
                copy.write_row((run_id, "", "queued", "Started", "", "{}", created))
                copy.write_row((run_id, "queued", "running", "Started", "", "{}", started))
                if status != "running":
                    copy.write_row((run_id, "running", status, status.title(), "", "{}", row[2]))
        with cursor.copy(
            "COPY pipelines_journalentry (run_id, seq, call, status, result, error, created_at, completed_at) "
            "FROM STDIN"
        ) as copy:
            for row in run_rows:
                at = row[12]
                for seq in range(1, 11):
                    copy.write_row((row[0], seq, f"step s{seq}", "completed", '{"value": null}', "", at, at))
        record_ids = [n.id for _tree, nodes in trees for n in nodes]
        with cursor.copy(
            "COPY observability_logline (record_id, at, stream, severity, source, message) FROM STDIN"
        ) as copy:
            start = now - timedelta(days=1)
            for written in range(LOG_LINES):
                record_id = record_ids[written % len(record_ids)]
                at = start + timedelta(microseconds=written * 50)
                copy.write_row((record_id, at, "stdout", "info", "run", f"line {written} of the run's work"))
                if written % 250_000 == 249_999:
                    log(f"  {written + 1} log lines")
        # The stands hold records with TTLs, some expiring within the hour.
        holdings = [n.id for _tree, nodes in stand_trees for n in nodes[1:]]
        cursor.execute(
            "UPDATE records_record SET expires_at = now() + (random() * interval '3 hours') WHERE id = ANY(%s)",
            [holdings],
        )
        cursor.execute(
            "UPDATE records_record SET name = %s || name WHERE kind = 'graphene.stand' AND parent_id IS NULL",
            ["bench-"],
        )
    analyze(
        "records_record",
        "records_event",
        "pipelines_run",
        "pipelines_runevent",
        "pipelines_journalentry",
        "observability_logline",
    )
    return {"runs": [row[0] for row in run_rows], "records": len(record_ids) + STANDS * (HOLDINGS + 1)}


def fleet(n: int) -> None:
    """``n`` agents (through the services, as a pipeline declares them) with capabilities."""
    from apps.agents import services as agents
    from apps.records import services as records

    owner = records.record_create_root(kind="graphene.run", name="fleet#1")
    for i in range(n):
        agent = agents.agent_record_declare(owner=owner, name=f"m{i:03d}", labels={"pool": "ci"})
        agents.capability_publish(agent=agent, name="docker", version="27.1", labels={"arch": "amd64"})
        agents.capability_publish(agent=agent, name="python", version="3.11")


def timed(client: Any, path: str) -> float:
    began = time.perf_counter()
    response = client.get(path)
    elapsed = (time.perf_counter() - began) * 1000
    if response.status_code != 200:
        raise AssertionError(f"{path} answered {response.status_code}: {response.content[:300]!r}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--runs", type=int, default=10_000)
    args = parser.parse_args()

    with bench_environment("studio_pages", redis_db=9):
        from django.contrib.auth import get_user_model
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext

        began = time.monotonic()
        made = build(args.runs)
        took = time.monotonic() - began
        log(f"loaded {args.runs} runs, {made['records']} records, {LOG_LINES} log lines in {took:.0f}s")
        fleet(AGENTS)
        user = get_user_model().objects.create_superuser("bench", password=None)
        client = Client(HTTP_HOST="localhost")
        client.force_login(user)
        rng = random.Random(13)
        pages: dict[str, Any] = {
            "home": lambda: "/",
            "runs": lambda: "/runs/",
            "runs_failed": lambda: "/runs/?status=failed",
            "run": lambda: f"/runs/{rng.choice(made['runs'])}/",
            "pipelines": lambda: "/pipelines/",
            "pipeline": lambda: f"/pipelines/{rng.choice(PIPELINES)}/",
            "stands": lambda: "/stands/",
            "agents": lambda: "/agents/",
            "artifacts": lambda: "/artifacts/",
            "topology": lambda: f"/topology/runs/{rng.choice(made['runs'])}/",
            "records": lambda: "/records/record/",
            "records_filtered": lambda: "/records/record/?kind=test.sleep&phase=ready",
            **{
                f"record_{tab}": (lambda tab=tab: f"/records/record/{rng.choice(made['runs'])}/change/?tab={tab}")
                for tab in ("state", "events", "logs", "metrics", "traces")
            },
            "record_delete": lambda: f"/records/record/{rng.choice(made['runs'])}/delete/",
        }
        results: dict[str, float] = {}
        max_queries = 0
        load = load_1m()
        for name, path in pages.items():
            timed(client, path())  # warm-up
            with CaptureQueriesContext(connection) as queries:
                timed(client, path())
            count = len(queries)  # now: the next request resets the connection's query log
            max_queries = max(max_queries, count)
            times = [timed(client, path()) for _ in range(args.reps)]
            p50, p95 = percentile(times, 50), percentile(times, 95)
            results[f"{name}_p95_ms"] = p95
            log(f"  {name}: p50 {p50:.1f} ms, p95 {p95:.1f} ms, {count} queries")
        figures(
            {
                "runs": args.runs,
                "records": made["records"],
                "log_lines": LOG_LINES,
                **results,
                "worst_p95_ms": max(results.values()),
                "max_queries": max_queries,
                "load_1m_before": load,
            }
        )


if __name__ == "__main__":
    main()
