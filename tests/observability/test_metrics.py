"""/metrics and per-record series: the exposition parses and counts what exists, it refuses
scrapers without a token, and a record's series aggregate per step exactly as documented."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from apps.agents import services as agents
from apps.observability import metrics
from apps.observability.models import MetricPoint, Span
from apps.observability.services import Sample, metric_write, metric_write_many, observability_purge
from apps.records import services as records
from apps.records.models import Record
from tests.factories import api_token

pytestmark = pytest.mark.django_db

END = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def scrape(client: Client, headers: dict[str, str]) -> dict[str, Any]:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(response.content.decode())}


def sample_value(families: dict[str, Any], family: str, name: str, **labels: str) -> float | None:
    for sample in families[family].samples:
        if sample.name == name and sample.labels == labels:
            return float(sample.value)
    return None


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def token(user: Any) -> str:
    return api_token(user)


def stand(name: str = "obs") -> Record:
    return records.record_create_root(kind="graphene.stand", name=name)


# --- /metrics -------------------------------------------------------------------------------


def test_metrics_count_records_by_kind_and_phase(token: str) -> None:
    client = Client()
    before = scrape(client, bearer(token))
    pending_before = sample_value(before, "graphene_records", "graphene_records", kind="test.sleep", phase="pending")
    owner = stand()
    for i in range(3):
        records.record_declare(kind="test.sleep", name=f"r{i}", owner=owner)
    after = scrape(client, bearer(token))
    pending = sample_value(after, "graphene_records", "graphene_records", kind="test.sleep", phase="pending")
    assert (pending or 0) - (pending_before or 0) == 3
    ready_stands = sample_value(after, "graphene_records", "graphene_records", kind="graphene.stand", phase="ready")
    assert ready_stands is not None
    assert ready_stands >= 1
    # Every family the documentation names is there, typed.
    types = {name: after[name].type for name in after}
    assert types["graphene_runs"] == "gauge"
    assert types["graphene_agents"] == "gauge"
    assert types["graphene_convergence_seconds"] == "histogram"
    assert types["graphene_deletion_seconds"] == "histogram"
    assert types["graphene_run_duration_seconds"] == "histogram"
    assert types["graphene_drift_detected"] == "counter"
    # Drift counters are exported for every kind, at zero until something drifts (other tests
    # in this process may have healed files: only a kind that never drifts is surely at zero).
    assert sample_value(after, "graphene_drift_detected", "graphene_drift_detected_total", kind="test.sleep") == 0
    assert sample_value(after, "graphene_drift_healed", "graphene_drift_healed_total", kind="file") is not None
    # The test settings use Redis as the broker: its queue depth is read with LLEN.
    assert sample_value(after, "graphene_broker_up", "graphene_broker_up") == 1
    assert "graphene_queue_depth" in after
    assert after["graphene_queue_depth"].samples


def test_metrics_refuse_a_scraper_without_a_valid_token(user: Any, token: str, settings: Any) -> None:
    client = Client()
    refused = client.get("/metrics")
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", headers={"Authorization": "Bearer not-a-token"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Basic {token}"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Token {token}"}).status_code == 200
    # A deactivated user's token no longer scrapes.
    user.is_active = False
    user.save()
    assert client.get("/metrics", headers=bearer(token)).status_code == 401
    # The dedicated scrape token, and the switch that opens /metrics.
    settings.GRAPHENE_METRICS_TOKEN = "scrape-secret-0123456789"
    assert client.get("/metrics", headers={"Authorization": "Bearer scrape-secret-0123456789"}).status_code == 200
    assert client.get("/metrics", headers={"Authorization": "Bearer scrape-secret-01234567"}).status_code == 401
    settings.GRAPHENE_METRICS_PUBLIC = True
    assert client.get("/metrics").status_code == 200
    assert client.post("/metrics").status_code == 405


def test_histograms_add_up_what_processes_observed(token: str, settings: Any) -> None:
    # This process's background flush is off, so the flushes below are the only ones; a kind
    # of its own keeps this test's totals apart from what other tests observed.
    settings.GRAPHENE_METRICS_FLUSH_SECONDS = 0
    kind = f"obs-{uuid.uuid4().hex[:8]}"
    metrics.observe_many(metrics.DELETION_SECONDS, [0.04, 0.3, 0.3, 7.0, 99_999.0], kind=kind)
    metrics.inc(metrics.DELETE_FAILURES, kind=kind)
    metrics.flush()
    metrics.observe(metrics.DELETION_SECONDS, 0.3, kind=kind)  # a second flush adds up
    families = scrape(Client(), bearer(token))  # a scrape flushes its own process first

    def bucket(le: str) -> float | None:
        return sample_value(families, "graphene_deletion_seconds", "graphene_deletion_seconds_bucket", kind=kind, le=le)

    assert bucket("0.05") == 1
    assert bucket("0.25") == 1
    assert bucket("0.5") == 4  # cumulative: 0.04 and three times 0.3
    assert bucket("10.0") == 5
    assert bucket("3600.0") == 5
    assert bucket("+Inf") == 6
    count = sample_value(families, "graphene_deletion_seconds", "graphene_deletion_seconds_count", kind=kind)
    total = sample_value(families, "graphene_deletion_seconds", "graphene_deletion_seconds_sum", kind=kind)
    assert count == 6
    assert total == pytest.approx(0.04 + 0.3 * 3 + 7.0 + 99_999.0)
    failures = sample_value(families, "graphene_deletion_failures", "graphene_deletion_failures_total", kind=kind)
    assert failures == 1
    with pytest.raises(ValueError, match="takes labels"):
        metrics.observe(metrics.DELETION_SECONDS, 1.0, pipeline="x")


# --- per-record series ------------------------------------------------------------------------


def at(minute: int, second: int = 0) -> datetime:
    return END - timedelta(hours=1) + timedelta(minutes=minute, seconds=second)


def test_series_aggregate_per_step_in_the_window(api: APIClient) -> None:
    owner = stand()
    record = records.record_declare(kind="test.sleep", name="measured", owner=owner)
    other = records.record_declare(kind="test.sleep", name="other", owner=owner)
    metric_write_many(
        samples=[
            # The window is 11:00-12:00; with a 10-minute step the first bucket is 11:00-11:10.
            Sample(record.pk, "cpu", 1.0, at(0, 5)),
            Sample(record.pk, "cpu", 3.0, at(4)),
            Sample(record.pk, "cpu", 2.0, at(9, 59)),  # the last of its bucket
            Sample(record.pk, "cpu", 10.0, at(10)),  # starts the next bucket
            Sample(record.pk, "cpu", 7.0, at(59, 59)),
            Sample(record.pk, "cpu", 100.0, at(-1)),  # before the window
            Sample(record.pk, "cpu", 100.0, END),  # the window's end is excluded
            Sample(record.pk, "mem", 5.0, at(30), {"unit": "mb"}),
            Sample(record.pk, "mem", 6.0, at(31), {"unit": "gb"}),
            Sample(other.pk, "cpu", 50.0, at(1)),  # another record's series
        ]
    )
    metric_write(record_id=record.pk, name="cpu", value=4.0, at=at(2))
    response = api.get(
        f"/api/v1/records/{record.pk}/metrics/", {"name": "cpu", "window": "1h", "step": "10m", "end": END.isoformat()}
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["names"] == ["cpu", "mem"]
    assert body["window_seconds"] == 3600
    assert body["step_seconds"] == 600
    assert body["start"] == (END - timedelta(hours=1)).isoformat()
    assert body["end"] == END.isoformat()
    assert [(s["name"], s["labels"]) for s in body["series"]] == [("cpu", {})]
    points = body["series"][0]["points"]
    assert points == [
        {"at": at(0).isoformat(), "count": 4, "avg": 2.5, "min": 1.0, "max": 4.0, "last": 2.0},
        {"at": at(10).isoformat(), "count": 1, "avg": 10.0, "min": 10.0, "max": 10.0, "last": 10.0},
        {"at": at(50).isoformat(), "count": 1, "avg": 7.0, "min": 7.0, "max": 7.0, "last": 7.0},
    ]
    # Every name when none is given; label sets are separate series.
    everything = api.get(f"/api/v1/records/{record.pk}/metrics/", {"step": "60s", "end": END.isoformat()}).json()
    assert [(s["name"], s["labels"]) for s in everything["series"]] == [
        ("cpu", {}),
        ("mem", {"unit": "gb"}),
        ("mem", {"unit": "mb"}),
    ]
    assert everything["window_seconds"] == 3600
    assert everything["step_seconds"] == 60
    assert [p["at"] for p in everything["series"][0]["points"]] == [at(m).isoformat() for m in (0, 2, 4, 9, 10, 59)]
    # A long window without a step gets a step that keeps the answer small.
    week = api.get(f"/api/v1/records/{record.pk}/metrics/", {"window": "7d", "end": END.isoformat()}).json()
    assert week["step_seconds"] == 605
    assert sum(p["count"] for p in week["series"][0]["points"]) == 7


def test_series_refuse_bad_parameters(api: APIClient) -> None:
    record = records.record_declare(kind="test.sleep", name="x", owner=stand())
    url = f"/api/v1/records/{record.pk}/metrics/"
    for params, field in (
        ({"window": "abc"}, "window"),
        ({"window": "0s"}, "window"),
        ({"step": "1.5s"}, "step"),
        ({"window": "1h", "step": "2h"}, "step"),
        ({"window": "30d", "step": "1s"}, "step"),
        ({"name": "not a name"}, "name"),
        ({"end": "yesterday"}, "end"),
    ):
        response = api.get(url, params)
        assert response.status_code == 400, (params, response.json())
        body = response.json()
        assert body["error"] == "validation_failed", body
        assert field in body["fields"], body
    assert api.get("/api/v1/records/00000000-0000-0000-0000-000000000000/metrics/").status_code == 404
    malformed = api.get("/api/v1/records/nope/metrics/")
    assert malformed.status_code == 400  # a malformed id names its field; a well-formed unknown one is a 404
    assert malformed.json()["error"] == "validation_failed"
    assert APIClient().get(url).status_code == 401


def test_metric_write_validates() -> None:
    record = records.record_declare(kind="test.sleep", name="v", owner=stand())
    from apps.core.errors import ValidationFailed

    for kwargs in (
        {"name": "bad name", "value": 1},
        {"name": "ok", "value": float("nan")},
        {"name": "ok", "value": "x"},
        {"name": "ok", "value": 1, "labels": {"bad-key": "v"}},
        {"name": "ok", "value": 1, "at": datetime(2026, 1, 1)},
    ):
        with pytest.raises(ValidationFailed):
            metric_write(record_id=record.pk, **kwargs)
    with pytest.raises(ValidationFailed):  # all or nothing
        metric_write_many(samples=[Sample(record.pk, "ok", 1.0), Sample(record.pk, "", 1.0)])
    assert not MetricPoint.objects.filter(record=record).exists()


def test_purge_keeps_what_is_within_retention(settings: Any) -> None:
    record = records.record_declare(kind="test.sleep", name="p", owner=stand())
    now = datetime.now(UTC)
    settings.GRAPHENE_METRIC_POINTS_RETENTION = timedelta(days=1)
    settings.GRAPHENE_SPANS_RETENTION = timedelta(days=2)
    metric_write_many(
        samples=[Sample(record.pk, "old", 1.0, now - timedelta(days=1, minutes=1)), Sample(record.pk, "new", 1.0, now)]
    )
    for age in (timedelta(days=3), timedelta(hours=1)):
        Span.objects.create(
            trace_id="a" * 32, span_id="b" * 16, name="s", started_at=now - age, ended_at=now - age, record=record
        )
    assert observability_purge(now=now) == {"metric_points": 1, "spans": 1}
    assert list(MetricPoint.objects.filter(record=record).values_list("name", flat=True)) == ["new"]
    assert Span.objects.filter(record=record).count() == 1


def test_an_agent_command_span_names_the_command_not_its_payload(django_capture_on_commit_callbacks: Any) -> None:
    owner = stand("agents")
    agent = agents.agent_record_declare(owner=owner, name="builder")
    command = agents.command_submit(
        agent=agent,
        kind="exec",
        payload={"argv": ["/usr/bin/deploy", "--password=hunter2-secret"], "env": {"TOKEN": "hunter2-secret"}},
    )
    with django_capture_on_commit_callbacks(execute=True):  # the span is written once the end commits
        agents.command_cancel(command=command)
    span = Span.objects.get(record=agent, name__startswith="agent.exec")
    assert span.name == "agent.exec deploy"
    assert span.attributes["graphene.command.id"] == str(command.pk)
    assert span.attributes["graphene.command.status"] == "cancelled"
    assert "hunter2" not in str(span.attributes)
    assert "hunter2" not in span.status_message
