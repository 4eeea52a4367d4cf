"""The Studio's records pages, served by Django's test client: the trees and the filters, a
record's inspector and its five tabs, and the actions (delete the subtree, extend or release
the TTL, hand to a stand) calling the services the API calls, after its checks."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.observability import services as observability
from apps.observability.models import Span, SpanStatus
from apps.observability.tracing import spans_write
from apps.pipelines import services as pipelines
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Event, Record
from tests import factories

pytestmark = pytest.mark.django_db

# What the stock admin showed on every record page: the tree's bookkeeping, never the user's.
INTERNALS = re.compile(r"\b(lft|rght|tree_id|tree id|Lft|Rght|Tree id|mptt)\b")


def run_root(name: str) -> Record:
    return records.record_create_root(kind="graphene.run", name=name)


def tree(name: str, children: int, **labels: str) -> tuple[Record, list[Record]]:
    root = run_root(name)
    return root, [
        records.record_declare(kind="test.sleep", name=f"part-{i}", owner=root, labels=labels) for i in range(children)
    ]


def rows(page: str) -> list[str]:
    return re.findall(r'<tr data-record="([0-9a-f-]+)"', page)


def tombstone(record: Record) -> None:
    """The record as its deletion leaves it (the kind confirmed the object gone)."""
    records.record_delete_request(record=record)
    for phase in (Phase.DELETING, Phase.DELETED):
        if Record.objects.get(pk=record.pk).phase != phase:
            records.record_transition([Record.objects.get(pk=record.pk)], phase, reason="Test")


def test_the_list_shows_the_trees_newest_roots_first_without_tombstones(studio: Client) -> None:
    older, (a, b) = tree("sample.wait#1", 2)
    newer, (c,) = tree("sample.wait#2", 1)
    tombstone(b)
    page = studio.get("/records/record/")
    assert page.status_code == 200
    text = page.content.decode()
    assert rows(text) == [str(newer.pk), str(c.pk), str(older.pk), str(a.pk)]
    assert 'data-phase="pending"' in text
    assert not INTERNALS.search(text), INTERNALS.search(text)
    with_tombstones = studio.get("/records/record/?deleted=1").content.decode()
    assert rows(with_tombstones) == [str(newer.pk), str(c.pk), str(older.pk), str(a.pk), str(b.pk)]
    assert 'data-phase="deleted"' in with_tombstones


def test_the_list_filters_by_kind_phase_label_namespace_and_owner(studio: Client) -> None:
    root, (a, b) = tree("sample.wait#1", 2, tier="db")
    other, (c,) = tree("sample.wait#2", 1, tier="web")
    records.record_transition([a], Phase.CREATING, reason="Test")
    records.record_transition([Record.objects.get(pk=a.pk)], Phase.CREATE_FAILED, reason="Test")

    def listed(query: str) -> list[str]:
        page = studio.get(f"/records/record/?{query}")
        assert page.status_code == 200
        return rows(page.content.decode())

    assert listed("kind=test.sleep") == [str(c.pk), str(b.pk), str(a.pk)]
    assert listed("kind=graphene.run") == [str(other.pk), str(root.pk)]
    assert listed("phase=create_failed") == [str(a.pk)]
    assert listed("phase__exact=create_failed") == [str(a.pk)]  # the home page's links
    assert listed("phase=create_failed&phase=pending&kind=test.sleep") == [str(c.pk), str(b.pk), str(a.pk)]
    assert listed("label=tier%3Dweb") == [str(c.pk)]
    assert listed(f"owner={root.pk}") == [str(b.pk), str(a.pk)]
    assert listed("namespace=elsewhere&kind=test.sleep") == []
    assert listed("namespace=default") == rows(studio.get("/records/record/").content.decode())
    refused = studio.get("/records/record/?label=tier").content.decode()
    assert "must look like key=value" in refused
    assert "no record" in studio.get("/records/record/?owner=not-an-id").content.decode()


def test_the_list_costs_the_same_queries_for_10_and_100_rows(studio: Client) -> None:
    for i in range(2):
        tree(f"sample.wait#{i}", 4)
    with CaptureQueriesContext(connection) as ten:
        page = studio.get("/records/record/")
    assert len(rows(page.content.decode())) == 10
    with CaptureQueriesContext(connection) as ten_found:
        found = studio.get("/records/record/?kind=test.sleep")
    assert len(rows(found.content.decode())) == 8
    for i in range(2, 12):
        tree(f"sample.wait#{i}", 8)
    with CaptureQueriesContext(connection) as hundred:
        page = studio.get("/records/record/")
    assert len(rows(page.content.decode())) == 100
    with CaptureQueriesContext(connection) as hundred_found:
        found = studio.get("/records/record/?kind=test.sleep")
    assert len(rows(found.content.decode())) == 50  # one page
    assert len(hundred) == len(ten)
    assert len(hundred_found) == len(ten_found)


def test_a_big_tree_shows_its_first_records_and_says_how_many_more(studio: Client) -> None:
    root, parts = tree("sample.wait#1", 40)
    text = studio.get("/records/record/").content.decode()
    assert rows(text) == [str(root.pk)] + [str(p.pk) for p in parts[:15]]
    assert "and 25 more in this tree" in text


def test_the_inspector_shows_the_state_without_internals(studio: Client) -> None:
    stand = pipelines.stand_get("sample.handoff")
    _root, (db,) = tree("sample.handoff#1", 1, tier="db")
    records.record_transfer(record=db, new_owner=stand, expires_at=timezone.now() + timedelta(hours=2))
    volume = records.record_declare(kind="test.sleep", name="volume", owner=db, spec={"create_ms": 5})
    Record.objects.filter(pk=db.pk).update(
        outputs={"address": "10.0.0.7", "ports": [5432]},
        conditions=[{"type": "Ready", "status": "True", "reason": "Created", "message": "up"}],
        heals=3,
    )
    page = studio.get(f"/records/record/{db.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert not INTERNALS.search(text), INTERNALS.search(text)
    # The owner chain as breadcrumbs, from the root down.
    crumbs = text.split('id="owner-chain"')[1].split("</div>")[0]
    assert f'data-owner="{stand.pk}"' in crumbs
    assert "test.sleep/part-0" in crumbs
    outputs = text.split('id="record-outputs">')[1].split("</pre>")[0]
    assert "address: 10.0.0.7" in outputs
    assert "ports:\n- 5432" in outputs
    assert "create_ms: 5" not in text  # the child's spec is on its own page
    assert f'data-record="{volume.pk}"' in text.split('id="record-children"')[1]
    assert "Created" in text.split('id="record-conditions"')[1]
    assert "heal · healed 3 times" in text
    assert "data-countdown" in text.split('id="record-ttl"')[1][:300]
    assert "tier=db" in text
    for tab in ("state", "events", "logs", "metrics", "traces"):
        assert f'id="tab-{tab}"' in text
    assert studio.get(f"/records/record/{db.pk}/").status_code == 302  # the old address leads here
    assert studio.get("/records/record/00000000-0000-0000-0000-000000000000/change/").status_code == 404
    assert studio.get(f"/records/record/{db.pk}/change/?tab=nosuch").status_code == 404
    assert studio.get("/records/record/add/").status_code == 404  # no form makes a record


def test_the_events_tab_lists_the_newest_first_and_pages_back(studio: Client, monkeypatch: Any) -> None:
    _root, (part,) = tree("sample.wait#1", 1)
    for hours in (1, 2, 3):
        records.record_extend(record=Record.objects.get(pk=part.pk), by=timedelta(hours=hours))
    text = studio.get(f"/records/record/{part.pk}/change/?tab=events").content.decode()
    table = text.split('id="record-events"')[1]
    ids = [int(i) for i in re.findall(r'data-event="(\d+)"', table)]
    assert ids == sorted(Event.objects.filter(record=part).values_list("id", flat=True), reverse=True)
    assert table.index('data-type="ttl_changed"') < table.index('data-type="declared"')
    fragment = studio.get(f"/records/record/{part.pk}/change/?tab=events&fragment=tab", HTTP_HX_REQUEST="true")
    assert fragment.content.decode().lstrip().startswith("<p")  # only the tab, for the live refresh
    monkeypatch.setattr("apps.studio.views.records.EVENTS_SHOWN", 2)
    first = studio.get(f"/records/record/{part.pk}/change/?tab=events").content.decode()
    assert re.findall(r'data-event="(\d+)"', first) == [str(i) for i in ids[:2]]
    older = re.search(r"before=(\d+)", first)
    assert older is not None
    rest = studio.get(f"/records/record/{part.pk}/change/?tab=events&before={older.group(1)}").content.decode()
    assert re.findall(r'data-event="(\d+)"', rest) == [str(i) for i in ids[2:4]]


def test_the_logs_metrics_and_traces_tabs(studio: Client) -> None:
    root, (part,) = tree("sample.wait#1", 1)
    logs = studio.get(f"/records/record/{root.pk}/change/?tab=logs").content.decode()
    assert f'data-log-record="{root.pk}"' in logs  # studio.js follows ws/records/<id>/logs/

    now = timezone.now()
    observability.metric_write_many(
        samples=[
            observability.Sample(part.pk, "queue_depth", value, at=now - timedelta(minutes=minutes))
            for minutes, value in [(50, 1.0), (30, 4.0), (10, 2.0)]
        ]
    )
    metrics = studio.get(f"/records/record/{part.pk}/change/?tab=metrics").content.decode()
    chart = metrics.split('data-series="queue_depth"')[1].split("</figure>")[0]
    assert "last 2" in chart
    assert "3 points" in chart
    assert chart.count("<circle") == 3
    line = re.search(r'<polyline class="studio-chart-line" points="([^"]+)"', chart)
    assert line is not None
    heights = [float(p.split(",")[1]) for p in line.group(1).split()]
    assert heights[1] < heights[2] < heights[0]  # 4 is drawn highest, then 2, then 1
    assert "No metric points in the last 5m (it has queue_depth" in studio.get(
        f"/records/record/{part.pk}/change/?tab=metrics&window=5m"
    ).content.decode().replace("\n", " ")
    assert "not a duration" in studio.get(f"/records/record/{part.pk}/change/?tab=metrics&window=soon").content.decode()

    def span(name: str, record: Record, start: int, end: int, status: str = SpanStatus.OK) -> Span:
        return Span(
            trace_id="a" * 32,
            span_id=f"{start:016x}",
            name=name,
            record=record,
            started_at=now + timedelta(seconds=start),
            ended_at=now + timedelta(seconds=end),
            status=status,
        )

    spans_write([span("record_converge", part, 0, 2), span("record.delete", part, 5, 6, SpanStatus.ERROR)])
    traces = studio.get(f"/records/record/{root.pk}/change/?tab=traces").content.decode()
    assert "2 spans of work on this record and what it owns, 1 failed" in traces
    names = re.findall(r'<span class="studio-span-name">([^<]+)</span>', traces)
    assert names == ["graphene.run/sample.wait#1", "record_converge", "record.delete"]
    assert "No spans yet." in studio.get(f"/records/record/{run_root('x#1').pk}/change/?tab=traces").content.decode()


def test_delete_shows_what_goes_then_calls_the_service(studio: Client) -> None:
    _root, (db, web) = tree("sample.wait#1", 2)
    for name in ("data", "logs"):
        records.record_declare(kind="file", name=name, owner=db, spec={"path": name, "content": ""})
    confirm = studio.get(f"/records/record/{db.pk}/delete/")
    assert confirm.status_code == 200
    text = confirm.content.decode()
    assert 'id="delete-total">3<' in text
    counts = dict(re.findall(r'<tr data-kind="([^"]+)"><td>[^<]+</td><td>(\d+)</td>', text))
    assert counts == {"file": "2", "test.sleep": "1"}
    assert not Record.objects.filter(deletion_requested_at__isnull=False).exists()  # asking changes nothing
    done = studio.post(f"/records/record/{db.pk}/delete/")
    assert done.status_code == 302
    assert done["Location"] == f"/records/record/{db.pk}/change/"
    marked = set(Record.objects.filter(deletion_requested_at__isnull=False).values_list("name", flat=True))
    assert marked == {"part-0", "data", "logs"}
    event = Event.objects.filter(record=db, type="deletion_requested").get()
    assert event.actor is not None
    assert event.actor.get_username() == "ada"
    assert "Delete" in studio.get(f"/records/record/{web.pk}/change/").content.decode()
    assert 'id="action-delete"' not in studio.get(f"/records/record/{db.pk}/change/").content.decode()


def test_extend_and_release_the_ttl(studio: Client) -> None:
    _root, (part,) = tree("sample.wait#1", 1)
    act = f"/records/record/{part.pk}/act/"
    assert studio.get(act).status_code == 405
    studio.post(act, {"do": "1d"})
    expires = Record.objects.get(pk=part.pk).expires_at
    assert expires is not None
    assert expires > timezone.now() + timedelta(hours=23)
    studio.post(act, {"do": "1h"})
    later = Record.objects.get(pk=part.pk).expires_at
    assert later is not None
    assert later - expires > timedelta(minutes=59)
    refused = studio.post(act, {"do": "1y"}, follow=True).content.decode()
    assert "Extend by one of [&#x27;1h&#x27;, &#x27;1d&#x27;, &#x27;7d&#x27;], not &#x27;1y&#x27;" in refused
    assert Record.objects.get(pk=part.pk).expires_at == later
    studio.post(act, {"do": "release"})
    assert Record.objects.get(pk=part.pk).expires_at is None
    reasons = list(Event.objects.filter(record=part, type="ttl_changed").values_list("reason", flat=True))
    assert reasons == ["Extended", "Extended", "Released"]


def test_hand_a_record_to_a_stand(studio: Client) -> None:
    root, (db,) = tree("sample.handoff#1", 1)
    records.record_declare(kind="test.sleep", name="volume", owner=db)
    page = studio.get(f"/records/record/{db.pk}/change/").content.decode()
    assert '<option value="sample.handoff" selected>' in page  # its run's pipeline
    assert 'id="stand-form"' not in studio.get(f"/records/record/{root.pk}/change/").content.decode()
    act = f"/records/record/{db.pk}/act/"
    refused = studio.post(act, {"do": "stand", "pipeline": "nosuch"}, follow=True).content.decode()
    assert "No pipeline &#x27;nosuch&#x27; is loaded" in refused
    assert Record.objects.get(pk=db.pk).parent_id == root.pk
    studio.post(act, {"do": "stand", "pipeline": "sample.handoff", "keep_for": "1d"})
    moved = Record.objects.get(pk=db.pk)
    assert moved.parent is not None
    assert (moved.parent.kind, moved.parent.name) == ("graphene.stand", "sample.handoff")
    assert moved.expires_at is not None
    assert moved.expires_at > timezone.now() + timedelta(hours=23)
    assert Record.objects.get(name="volume").parent_id == db.pk  # its subtree went with it
    assert f'data-record="{db.pk}"' in studio.get("/stands/").content.decode()


def test_the_records_pages_take_the_admins_view_permission(django_user_model: Any) -> None:
    _root, (part,) = tree("sample.wait#1", 1)
    pages = ["/records/record/", f"/records/record/{part.pk}/change/", f"/records/record/{part.pk}/delete/"]
    anonymous = Client()
    for page in pages:
        response = anonymous.get(page)
        assert response.status_code == 302, page
        assert response["Location"].startswith("/login/"), page
    staff = django_user_model.objects.create_user(username="bob", password="pw", is_staff=True)
    client = Client()
    client.force_login(staff)
    for page in pages:
        assert client.get(page).status_code == 403, page
    assert client.post(f"/records/record/{part.pk}/delete/").status_code == 403
    assert not Record.objects.filter(deletion_requested_at__isnull=False).exists()
    factories.bind(staff, "viewer")
    client.force_login(django_user_model.objects.get(pk=staff.pk))
    for page in pages:
        assert client.get(page).status_code == 200, page


def test_a_stand_holding_is_released_from_the_stands_page(studio: Client) -> None:
    stand = pipelines.stand_get("sample.handoff")
    _root, (held,) = tree("sample.handoff#1", 1)
    records.record_transfer(record=held, new_owner=stand, expires_at=timezone.now() + timedelta(minutes=30))
    assert 'value="release"' in studio.get("/stands/").content.decode()
    done = studio.post("/stands/", {"pipeline": "sample.handoff", "record": str(held.pk), "do": "release"}, follow=True)
    assert "is kept until someone deletes it" in done.content.decode()
    assert Record.objects.get(pk=held.pk).expires_at is None
    assert f'data-record="{held.pk}"' in done.content.decode()  # still held, without a TTL
