"""A record's inspector in a real browser (Debian's Chromium, headless) against the real web
server and workers: each of its five tabs, and a delete through its confirmation page that
the page then shows happening without a reload."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from selenium.webdriver.remote.webdriver import WebDriver

from apps.observability import services as observability
from apps.pipelines import services
from apps.pipelines.models import Run
from apps.records.models import Record
from tests.harness.browser import PASSWORD, Browser
from tests.harness.processes import Worker
from tests.harness.wait import wait_for
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def studio(web: WebServer, chromium: WebDriver, django_user_model: Any) -> Browser:
    django_user_model.objects.create_superuser(username="ada", password=PASSWORD)
    return Browser(chromium, web.url)


def test_each_inspector_tab_and_a_delete_through_its_confirmation_page(studio: Browser, workers: list[Worker]) -> None:
    run = services.run_start(pipeline_name="sample.studio", inputs={"parts": 2, "create_ms": 0, "lines": 3})
    asleep = Run.objects.filter(pk=run.pk, status="suspended", wake_at__isnull=False)
    wait_for(asleep.exists, what="the run to declare its parts, log and sleep")
    assert run.record_id is not None
    root = Record.objects.get(pk=run.record_id)
    part = Record.objects.get(parent=root, name="part-0")
    now = timezone.now()
    observability.metric_write_many(
        samples=[
            observability.Sample(root.pk, "queue_depth", float(value), at=now - timedelta(minutes=minutes))
            for minutes, value in [(40, 3), (20, 5), (5, 1)]
        ]
    )
    studio.log_in("ada", "/records/record/")
    tree = f'[data-tree="{root.pk}"] [data-record]'
    studio.wait(lambda: len(studio.attributes(tree, "data-record")) == 3, "for the run's tree in the list")
    assert studio.attributes(f"{tree} [data-phase]", "data-phase") == ["ready", "ready", "ready"]
    studio.screenshot("records-list")
    page = f"/records/record/{root.pk}/change/"
    studio.click(f'[data-record="{root.pk}"] a')
    studio.wait(lambda: studio.path() == page, "for the root's inspector")

    def on_tab(tab: str) -> None:
        studio.click(f"#tab-{tab}")
        studio.wait(lambda: studio.attributes("#record-tab", "data-tab") == [tab], f"for the {tab} tab")

    # State: the run's root owns both parts, ready.
    children = "#record-children [data-record] [data-phase]"
    studio.wait(lambda: studio.attributes(children, "data-phase") == ["ready", "ready"], "for both parts, ready")
    assert "graphene.run/sample.studio#1" in studio.texts("#record-head h1")[0]
    studio.screenshot("record-state")

    on_tab("events")
    studio.wait(lambda: studio.attributes("#record-events tbody tr", "data-type")[-1:] == ["declared"], "its events")
    studio.screenshot("record-events")

    on_tab("logs")
    studio.wait(
        lambda: any("hello from the run, line 2" in t for t in studio.texts(".studio-log-line")),
        "for the run's log lines, followed live",
    )
    studio.screenshot("record-logs")

    on_tab("metrics")
    studio.wait(lambda: studio.attributes("figure.studio-chart", "data-series") == ["queue_depth"], "for its chart")
    assert len(studio.attributes(".studio-chart-dot", "r")) == 3
    studio.screenshot("record-metrics")

    on_tab("traces")
    studio.wait(
        lambda: "record_converge" in studio.texts("#record-tab .studio-span-name"),
        "for the parts' convergence in the waterfall",
    )
    assert studio.texts("#record-tab .studio-span-name")[0] == "graphene.run/sample.studio#1"
    studio.screenshot("record-traces")

    # Delete part-0: its page, the confirmation page with what goes, then back to watch it go.
    part_page = f"/records/record/{part.pk}/change/"
    studio.open(part_page)
    studio.click("#action-delete")
    studio.wait(lambda: studio.path() == f"{part_page.removesuffix('change/')}delete/", "for the confirmation page")
    assert studio.texts("#delete-counts tbody tr") == ["test.sleep\t1"]
    assert Record.objects.get(pk=part.pk).deletion_requested_at is None, "asking deletes nothing"
    studio.screenshot("record-delete-confirm")
    studio.click("#confirm")
    studio.wait(lambda: studio.path() == part_page, "to come back to the record")
    studio.mark()
    studio.wait(
        lambda: studio.attributes("#record-head .studio-record-head", "data-phase") == ["deleted"],
        "for the record to be deleted",
    )
    studio.wait(
        lambda: studio.attributes("#record-facts [data-phase]", "data-phase") == ["deleted"],
        "for its state to say so too",
    )
    assert studio.still_the_same_page(), "the page was reloaded: it should have updated itself"
    assert not studio.texts("#action-delete"), "nothing is left to delete"
    studio.screenshot("record-deleted")
    assert Record.objects.get(pk=part.pk).phase == "deleted"
    assert Record.objects.get(parent=root, name="part-1").phase == "ready", "only what was chosen goes"
