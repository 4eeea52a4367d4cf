"""The Studio in a real browser (Debian's Chromium, headless) against the real web server and
real workers: what an engineer sees change without reloading, and what a click does."""

from __future__ import annotations

from typing import Any

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from apps.pipelines import services
from apps.pipelines.models import Run
from apps.records.models import Record
from tests.factories import api_token
from tests.harness.browser import PASSWORD, Browser
from tests.harness.processes import Worker
from tests.harness.wait import wait_for
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def studio(web: WebServer, chromium: WebDriver, django_user_model: Any) -> Browser:
    django_user_model.objects.create_superuser(username="ada", password=PASSWORD)
    return Browser(chromium, web.url)


def test_a_run_page_follows_the_run_and_cancelling_it_deletes_what_it_owns(
    studio: Browser, workers: list[Worker]
) -> None:
    run = services.run_start(pipeline_name="sample.studio", inputs={"parts": 2, "create_ms": 1500, "lines": 3})
    page = f"/runs/{run.pk}/"
    studio.log_in("ada", page)
    studio.mark()
    parts = "#run-tree [data-record] [data-phase]"
    studio.wait(lambda: len(studio.attributes(parts, "data-phase")) == 3, "for the run's root and its two parts")
    studio.wait(lambda: set(studio.attributes(parts, "data-phase")) == {"ready"}, "for every part to be ready")
    studio.wait(
        lambda: any("hello from the run, line 2" in t for t in studio.texts(".studio-log-line")),
        "for the run's log lines",
    )
    studio.wait(lambda: "waiting for a timer until" in " ".join(studio.texts("#run-status")), "for the run to sleep")
    assert studio.attributes("#run-status .studio-run-head", "data-status") == ["suspended"]
    assert studio.still_the_same_page(), "the page was reloaded: it should have updated itself"
    studio.screenshot("run-page-live")

    studio.click("#action-cancel")
    studio.wait(lambda: studio.path() == f"{page}cancel/", "for the confirmation page")
    studio.click("#confirm")
    studio.wait(lambda: studio.path() == page, "to come back to the run")
    studio.mark()
    studio.wait(lambda: studio.attributes("#run-status .studio-run-head", "data-status") == ["cancelled"], "cancelled")
    studio.wait(lambda: set(studio.attributes(parts, "data-phase")) == {"deleted"}, "for every record to be deleted")
    assert studio.still_the_same_page()
    assert "cancelled by ada" in studio.attributes("#run-error", "textContent")[0] + " ".join(
        studio.texts("#run-error")
    )
    studio.screenshot("run-page-cancelled")
    assert Run.objects.get(pk=run.pk).status == "cancelled"
    assert set(Record.objects.filter(created_by_run_id=run.record_id).values_list("phase", flat=True)) == {"deleted"}
    # Where the time went: the run's executions, its records' convergence and deletion.
    studio.open(page)
    names = studio.texts("#run-timeline .studio-span-name")
    assert names[0] == "run sample.studio#1"
    for span in ("execute #1", "record_converge", "record.delete"):
        assert span in names, names


def test_the_home_page_counts_agree_with_the_api(
    studio: Browser, workers: list[Worker], web: WebServer, django_user_model: Any
) -> None:
    runs = [services.run_start(pipeline_name="sample.studio", inputs={"create_ms": 0, "lines": 0}) for _ in range(2)]
    asleep = Run.objects.filter(pk__in=[r.pk for r in runs], status="suspended", wake_at__isnull=False)
    wait_for(lambda: asleep.count() == 2, what="both runs to sleep on their timers")
    studio.log_in("ada", "/")
    suspended = '[data-count="runs-suspended"] .count'
    studio.wait(lambda: studio.texts(suspended) == ["2"], "for the home page to count both")
    token = api_token(django_user_model.objects.get(username="ada"))
    status, body = web.get("runs/", token, status="suspended")
    assert status == 200
    assert len(body["results"]) == int(studio.texts(suspended)[0])
    studio.click('[data-count="runs-suspended"]')
    studio.wait(lambda: studio.path() == "/runs/", "for the runs list the number links to")
    assert len(studio.texts("#runs tbody tr[data-run]")) == 2
    studio.screenshot("home-runs")


def test_starting_a_run_from_the_form_shows_the_fields_error_then_lands_on_the_run(
    studio: Browser, workers: list[Worker]
) -> None:
    studio.log_in("ada", "/pipelines/sample.studio/")
    parts = studio.driver.find_element("id", "input-parts")
    parts.clear()
    parts.send_keys("20")
    studio.click("#start")
    studio.wait(lambda: studio.texts('[data-field="parts"] .errorlist'), "for the field's error")
    assert "less than or equal to 10" in studio.texts('[data-field="parts"] .errorlist')[0]
    assert not Run.objects.exists()
    studio.screenshot("start-form-error")
    parts = studio.driver.find_element("id", "input-parts")
    parts.clear()
    parts.send_keys("1")
    studio.click("#start")
    run = studio.wait(lambda: Run.objects.filter(pipeline__name="sample.studio").first(), "for the run to start")
    studio.wait(lambda: studio.path() == f"/runs/{run.pk}/", "to land on the new run's page")
    studio.wait(lambda: any("hello from the run, line 0" in t for t in studio.texts(".studio-log-line")), "for its log")
    assert Run.objects.get(pk=run.pk).inputs["parts"] == 1
