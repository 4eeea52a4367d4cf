"""The Studio's pages, served by Django's test client: what they show, what their links
filter, and queries that do not grow with the rows shown."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.pipelines import services
from apps.pipelines.choices import RunStatus
from apps.pipelines.models import Run
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Record

pytestmark = pytest.mark.django_db


def started(n: int, **inputs: Any) -> list[Run]:
    return [services.run_start(pipeline_name="sample.wait", inputs=inputs) for _ in range(n)]


def test_the_home_page_counts_what_is_running_and_what_needs_a_look(studio: Client) -> None:
    runs = started(3)
    assert runs[0].record is not None
    db = records.record_declare(kind="test.sleep", name="db", owner=runs[0].record)  # pending: not settled
    acquired = services.run_lease_acquire(run_id=runs[0].pk)
    assert acquired is not None
    services.run_suspend(run_id=runs[0].pk, token=acquired[1], waiting_on=[str(db.pk)], wake_at=None)
    services.run_cancel(run=runs[2])
    page = studio.get("/")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'data-count="runs-queued"><span class="count">1</span>' in text
    assert 'data-count="runs-suspended"><span class="count">1</span>' in text
    assert f"sample.wait#{runs[0].number}</a>: test.sleep/db (pending)" in text
    assert 'href="/runs/?status=suspended"' in text
    assert 'href="/records/record/?phase__exact=create_failed"' in text
    # The runs list filters as the home page's link says.
    listed = studio.get("/runs/?status=suspended").content.decode()
    assert f'data-run="{runs[0].pk}"' in listed
    assert f'data-run="{runs[1].pk}"' not in listed


def test_the_runs_list_costs_the_same_queries_for_10_and_100_rows(studio: Client) -> None:
    started(10)
    with CaptureQueriesContext(connection) as ten:
        assert studio.get("/runs/").status_code == 200
    started(90)
    with CaptureQueriesContext(connection) as hundred:
        page = studio.get("/runs/?status=queued")
    assert page.status_code == 200
    assert page.content.decode().count('data-run="') == 50  # one page
    assert len(hundred) == len(ten)


def test_a_run_page_shows_its_inputs_tree_error_and_history(studio: Client) -> None:
    run = started(1, create_ms=5)[0]
    services.run_cancel(run=run)
    page = studio.get(f"/runs/{run.pk}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "&quot;create_ms&quot;: 5" in text
    assert f"graphene.run/sample.wait#{run.number}" in text
    assert "cancelled by" in text
    assert "Cancelled" in text  # the status history
    assert (
        studio.get(f"/runs/{run.pk}/?fragment=tree", HTTP_HX_REQUEST="true")
        .content.decode()
        .startswith("\n<h2>Resources</h2>")
    )
    assert studio.get("/runs/00000000-0000-0000-0000-000000000000/").status_code == 404


def test_cancel_resume_and_run_again_ask_first_then_call_the_services(studio: Client) -> None:
    run = started(1)[0]
    confirm = studio.get(f"/runs/{run.pk}/cancel/")
    assert confirm.status_code == 200
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED  # asking changes nothing
    done = studio.post(f"/runs/{run.pk}/cancel/")
    assert done.status_code == 302
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED
    studio.post(f"/runs/{run.pk}/resume/")
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
    again = studio.post(f"/runs/{run.pk}/rerun/")
    newest = Run.objects.order_by("-created_at").first()
    assert newest is not None
    assert newest.pk != run.pk
    assert newest.inputs == run.inputs
    assert again["Location"] == f"/runs/{newest.pk}/"


def test_stands_list_holdings_and_extend_them(studio: Client) -> None:
    stand = services.stand_get("sample.handoff")
    root = records.record_create_root(kind="graphene.run", name="sample.handoff#1")
    held = records.record_declare(kind="test.sleep", name="db", owner=root)
    records.record_transfer(record=held, new_owner=stand, expires_at=timezone.now() + timedelta(minutes=30))
    page = studio.get("/stands/?expiring=1").content.decode()
    assert f'data-record="{held.pk}"' in page
    assert "data-countdown" in page
    studio.post("/stands/", {"pipeline": "sample.handoff", "record": str(held.pk), "do": "1d"})
    assert Record.objects.get(pk=held.pk).expires_at > timezone.now() + timedelta(hours=23)  # type: ignore[operator]
    assert f'data-record="{held.pk}"' not in studio.get("/stands/?expiring=1").content.decode()
    refused = studio.post("/stands/", {"pipeline": "sample.handoff", "record": str(root.pk), "do": "1d"}, follow=True)
    assert "is not held by the stand" in refused.content.decode()
    assert Record.objects.get(pk=held.pk).phase != Phase.DELETED


def test_the_studio_needs_a_staff_login(django_user_model: Any) -> None:
    anonymous = Client().get("/runs/")
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith("/login/")
    user = django_user_model.objects.create_user(username="bob", password="pw")
    client = Client()
    client.force_login(user)
    assert client.get("/runs/").status_code == 302


def test_the_pipelines_page_shows_recent_runs_rates_and_stands(studio: Client) -> None:
    runs = started(3)
    services.run_cancel(run=runs[0])
    page = studio.get("/pipelines/").content.decode()
    assert 'data-pipeline="sample.wait"' in page
    assert f'href="/runs/{runs[2].pk}/"' in page
    with CaptureQueriesContext(connection) as few:
        studio.get("/pipelines/")
    started(20)
    with CaptureQueriesContext(connection) as many:
        studio.get("/pipelines/")
    assert len(many) == len(few)


def test_the_start_form_lays_out_the_schema_and_starts_a_typed_run(studio: Client) -> None:
    page = studio.get("/pipelines/sample.form/").content.decode()
    for name, kind in [
        ("branch", 'type="text"'),
        ("replicas", 'type="number"'),
        ("ratio", 'step="any"'),
        ("dry_run", 'type="checkbox"'),
        ("db.host", 'type="text"'),
        ("db.port", 'type="number"'),
    ]:
        assert f'name="{name}"' in page, name
        assert kind in page.split(f'name="{name}"')[0].rsplit("<", 1)[-1] + page.split(f'name="{name}"')[1][:80], name
    assert '<option value="fast">fast</option>' in page
    assert 'name="tags"' in page
    assert 'value="5432"' in page  # the nested model's default

    posted = {
        "branch": "main",
        "replicas": "3",
        "ratio": "0.25",
        "mode": "fast",
        "tags": "a\nb\n",
        "dry_run": "true",
        "note": "",
        "db.host": "db2",
        "db.port": "6543",
    }
    done = studio.post("/pipelines/sample.form/", posted)
    assert done.status_code == 302
    run = Run.objects.get(pipeline__name="sample.form")
    assert done["Location"] == f"/runs/{run.pk}/"
    assert run.inputs == {
        "branch": "main",
        "replicas": 3,
        "ratio": 0.25,
        "mode": "fast",
        "tags": ["a", "b"],
        "dry_run": True,
        "note": None,
        "db": {"host": "db2", "port": 6543},
    }


def test_the_start_form_shows_each_fields_error_and_starts_nothing(studio: Client) -> None:
    typed_wrong = studio.post("/pipelines/sample.form/", {"branch": "main", "replicas": "three"}).content.decode()
    assert "&#x27;three&#x27; is not a whole number" in typed_wrong
    refused = studio.post("/pipelines/sample.form/", {"branch": "", "replicas": "11", "db.port": "0"}).content.decode()
    # The server's validation, on the fields it names (the same rules as the API).
    field = refused.split('data-field="replicas"')[1].split("</div>")[0]
    assert "less than or equal to 10" in field
    assert "greater than or equal to 1" in refused.split('data-field="db.port"')[1].split("</div>")[0]
    assert 'value="11"' in refused  # what was typed stays
    assert not Run.objects.filter(pipeline__name="sample.form").exists()
    assert studio.get("/pipelines/nosuch/").status_code == 404


def test_a_child_runs_page_links_its_parent_and_the_parent_lists_it(studio: Client) -> None:
    parent = started(1)[0]
    (child,) = services.run_start_children(
        parent=parent, pipeline_name="sample.child", inputs=[{"index": 0}], concurrency=1, group=1
    )
    page = studio.get(f"/runs/{child.pk}/").content.decode()
    link = page.split('id="run-parent"')[0].rsplit("<a ", 1)[1]
    assert f'href="/runs/{parent.pk}/"' in link
    assert f">sample.wait#{parent.number}</a>" in page
    assert f'href="/runs/{child.pk}/"' in studio.get(f"/runs/{parent.pk}/").content.decode()
