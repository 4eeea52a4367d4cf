"""Runs executed by real Celery workers leave a trace, step metrics and control-plane metrics,
readable over REST, ``/metrics`` and graphenectl (against a real web server)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from apps.observability.tracing import run_span_id
from apps.pipelines import services
from apps.pipelines.models import Run
from apps.records.choices import Phase
from apps.records.models import Record
from tests.conftest import Worker, wait_for
from tests.factories import api_token
from tests.harness.net import fetch
from tests.harness.web import WebServer
from tests.observability.conftest import graphenectl

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

MISSING = "00000000-0000-0000-0000-000000000000"


def finished(run: Run, timeout: float = 90) -> Run:
    ended = {"succeeded", "failed", "cancelled", "timed_out"}
    wait_for(lambda: Run.objects.get(pk=run.pk).status in ended, timeout=timeout, what=f"{run} to end")
    return Run.objects.get(pk=run.pk)


def tree_deleted(run: Run) -> bool:
    assert run.record_id is not None
    root = Record.objects.get(pk=run.record_id)
    return not Record.objects.filter(tree_id=root.tree_id).exclude(phase=Phase.DELETED).exists()


def spans(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node["children"]:
        found.extend(spans(child))
    return found


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(web: WebServer, token: str) -> Samples:
    status, raw = fetch(f"{web.url}/metrics", token=token, scheme="Bearer")
    assert status == 200, raw
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for family in text_string_to_metric_families(raw.decode())
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_a_run_leaves_a_trace_step_metrics_and_control_plane_metrics(
    fast_flush_worker: Callable[..., Worker], web: WebServer, user: Any
) -> None:
    fast_flush_worker()
    fast_flush_worker()
    token = api_token(user)
    run = services.run_start(
        pipeline_name="sample.tree", inputs={"branches": 2, "leaves": 1, "create_ms": 300, "step_ms": 50}
    )
    failing = services.run_start(pipeline_name="sample.fail", inputs={"retries": 1, "fail_times": 5})
    run, failing = finished(run), finished(failing)
    assert run.status == "succeeded", run.error
    assert failing.status == "failed"
    wait_for(lambda: tree_deleted(run), timeout=60, what="the run's tree to be deleted")
    wait_for(lambda: tree_deleted(failing), timeout=60, what="the failed run's tree to be deleted")

    # --- the trace: the run is the root; steps, executions, convergences and deletions below it
    status, trace = web.get(f"runs/{run.pk}/trace/", token)
    assert status == 200, trace
    root = trace["root"]
    assert trace["trace_id"] == run.pk.hex
    assert root["span_id"] == run_span_id(run.pk)
    assert root["name"] == f"run sample.tree#{run.number}"
    assert root["status"] == "ok"
    assert root["record"] == str(run.record_id)
    assert root["duration_ms"] > 0
    children = {child["name"]: child for child in root["children"]}
    for step in ("step use-branch-0", "step use-branch-1"):
        span = children[step]
        assert span["parent_span_id"] == root["span_id"]
        assert span["record"] == str(run.record_id)
        assert span["status"] == "ok"
        assert span["duration_ms"] >= 50
        assert span["attributes"]["graphene.step"] == step.removeprefix("step ")
    # Waiting on the branches suspended the run: the first execution ended suspended, the last
    # one succeeded, all in the same trace.
    executions = sorted((c for c in root["children"] if c["name"].startswith("execute #")), key=lambda c: c["name"])
    assert executions[0]["attributes"]["graphene.outcome"] == "suspended"
    assert executions[-1]["attributes"]["graphene.outcome"] == "succeeded"
    declared = {str(r.pk): r for r in Record.objects.filter(created_by_run_id=run.record_id)}
    branches = {pk for pk, r in declared.items() if r.name.startswith("branch-")}
    converged = {c["record"] for c in root["children"] if c["name"] == "record_converge"}
    assert branches <= converged
    batches = [c for c in root["children"] if c["name"] == "records.delete_batch"]
    deleted = {d["record"] for batch in batches for d in batch["children"] if d["name"] == "record.delete"}
    assert set(declared) | {str(run.record_id)} <= deleted
    assert trace["span_count"] == len(spans(root))
    assert trace["errors"] == 0

    status, failed_trace = web.get(f"runs/{failing.pk}/trace/", token)
    assert status == 200
    assert failed_trace["root"]["status"] == "error"
    flaky = next(s for s in spans(failed_trace["root"]) if s["name"] == "step flaky")
    assert flaky["status"] == "error"
    assert "boom" in flaky["status_message"]
    assert flaky["attributes"]["graphene.attempts"] == 2
    assert failed_trace["errors"] >= 2

    # --- step durations on the run's record, one series per step
    end = datetime.now(UTC) + timedelta(seconds=1)
    params = {"name": "step_duration_seconds", "window": "3600", "step": "60", "end": end.isoformat()}
    status, series = web.get(f"records/{run.record_id}/metrics/", token, **params)
    assert status == 200, series
    assert "step_duration_seconds" in series["names"]
    by_step = {s["labels"]["step"]: s["points"] for s in series["series"]}
    assert set(by_step) == {"use-branch-0", "use-branch-1"}
    for points in by_step.values():
        assert sum(p["count"] for p in points) == 1
        assert points[0]["last"] >= 0.05

    # --- /metrics: workers' histograms reach the web process; gauges count what exists
    assert fetch(f"{web.url}/metrics")[0] == 401

    def metrics_arrived() -> Samples:
        samples = scrape(web, token)
        done = (
            value(samples, "graphene_convergence_seconds_count", kind="test.sleep") >= len(branches)
            and value(samples, "graphene_deletion_seconds_count", kind="test.sleep") >= len(declared)
            and value(samples, "graphene_run_duration_seconds_count", pipeline="sample.tree", status="succeeded") >= 1
            and value(samples, "graphene_run_duration_seconds_count", pipeline="sample.fail", status="failed") >= 1
        )
        return samples if done else {}

    samples = wait_for(metrics_arrived, timeout=30, interval=0.2, what="the workers' metrics in /metrics")
    assert value(samples, "graphene_runs", pipeline="sample.tree", status="succeeded") >= 1
    assert value(samples, "graphene_records", kind="test.sleep", phase="deleted") >= len(declared)
    assert value(samples, "graphene_deletion_seconds_bucket", kind="test.sleep", le="+Inf") == value(
        samples, "graphene_deletion_seconds_count", kind="test.sleep"
    )

    # --- graphenectl prints what the API answers, and exits with the documented codes
    cli_trace = graphenectl(web, token, "trace", f"run/{run.pk}", "-o", "json")
    assert cli_trace.code == 0, cli_trace.err
    assert cli_trace.json() == trace
    table = graphenectl(web, token, "trace", str(run.pk))
    assert table.code == 0, table.err
    assert f"run sample.tree#{run.number}" in table.out
    assert "step use-branch-0" in table.out
    assert "records.delete_batch" in table.out
    assert "span(s), 0 error(s)" in table.err
    failed_table = graphenectl(web, token, "trace", str(failing.pk))
    assert "error" in failed_table.out
    assert "boom" in failed_table.out

    cli_series = graphenectl(
        web, token, "metrics", f"run/{run.pk}", "--name", "step_duration_seconds",
        "--window", "1h", "--step", "60s", "--end", end.isoformat(), "-o", "json",
    )  # fmt: skip
    assert cli_series.code == 0, cli_series.err
    assert cli_series.json() == series
    listed = graphenectl(web, token, "metrics", str(run.record_id), "--name", "step_duration_seconds")
    assert listed.code == 0, listed.err
    assert "step=use-branch-0" in listed.out
    assert "step=use-branch-1" in listed.out

    bad_window = graphenectl(web, token, "metrics", str(run.record_id), "--window", "abc")
    assert bad_window.code == 2
    assert "--window 'abc' is not a duration" in bad_window.err
    bad_name = graphenectl(web, token, "metrics", str(run.record_id), "--name", "no spaces")
    assert bad_name.code == 2
    assert "not a metric name" in bad_name.err
    assert graphenectl(web, token, "metrics", MISSING).code == 3
    assert graphenectl(web, token, "trace", MISSING).code == 3
    assert graphenectl(web, token, "trace", f"record/{run.record_id}").code == 2
