"""Every Studio page under its Content-Security-Policy, in a real browser (Debian's Chromium,
headless) against the real web server and workers: the policy refuses nothing any page does
(the browser reports each refusal: ``securitypolicyviolation`` and the console), and what is
live or interactive still works with it."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from apps.agents import services as agents
from apps.artifacts import services as artifacts
from apps.pipelines import services
from apps.pipelines.models import Pipeline, Run
from apps.pipelines.services import triggers
from apps.records.models import Record
from tests.harness.browser import PASSWORD, Browser, csp_violations
from tests.harness.net import fetch_response
from tests.harness.processes import Worker
from tests.harness.wait import wait_for
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def studio(web: WebServer, chromium: WebDriver, django_user_model: Any) -> Browser:
    django_user_model.objects.create_superuser(username="ada", password=PASSWORD)
    return Browser(chromium, web.url)


def shows(studio: Browser, css: str) -> bool:
    return bool(studio.driver.execute_script("return !!document.querySelector(arguments[0])", css))


def refused(studio: Browser, page: str) -> list[str]:
    return [f"{page}: {violation}" for violation in csp_violations(studio.driver)]


def test_every_studio_page_runs_under_its_policy_and_stays_live(
    studio: Browser, workers: list[Worker], web: WebServer
) -> None:
    _, headers, _ = fetch_response(f"{web.url}/login/")
    policy = headers["Content-Security-Policy"]
    assert "script-src 'self';" in policy
    assert "unsafe" not in policy, policy
    problems: list[str] = []

    studio.open("/login/")
    studio.wait(lambda: studio.texts("#login-form"), "for the login form")
    problems += refused(studio, "/login/")

    run = services.run_start(pipeline_name="sample.studio", inputs={"parts": 2, "create_ms": 1500, "lines": 3})
    page = f"/runs/{run.pk}/"
    studio.log_in("ada", page)
    # Live: the page follows the run (websocket hints, htmx fragments) without a reload.
    studio.mark()
    parts = "#run-tree [data-record] [data-phase]"
    studio.wait(lambda: set(studio.attributes(parts, "data-phase")) == {"ready"}, "for every part to be ready")
    studio.wait(lambda: len(studio.attributes(parts, "data-phase")) == 3, "for the run's root and its two parts")
    studio.wait(
        lambda: any("hello from the run, line 2" in t for t in studio.texts(".studio-log-line")),
        "for the run's log lines, from the log websocket",
    )
    studio.wait(lambda: "waiting for a timer until" in " ".join(studio.texts("#run-status")), "for the run to sleep")
    assert studio.still_the_same_page(), "the page was reloaded: it should have updated itself"
    # Depths come as data- attributes, set as CSS variables by the Studio's script.
    levels = studio.driver.execute_script(
        "return Array.from(document.querySelectorAll('#run-tree [data-level]'),"
        " e => getComputedStyle(e).getPropertyValue('--level').trim())"
    )
    assert levels == ["0", "1", "1"], levels
    problems += refused(studio, page)

    run = Run.objects.get(pk=run.pk)
    assert run.record_id is not None
    root = Record.objects.get(pk=run.record_id)
    part = Record.objects.get(parent=root, name="part-0")
    stand = services.stand_get("sample.studio")  # the pipeline's stand, for its topology
    agent = agents.agent_record_declare(owner=stand, name="builder", labels={"pool": "ci"})
    artifact, _ = artifacts.artifact_upload(
        owner=root, name="report.txt", chunks=[b"all green\n"], content_type="text/plain"
    )
    pages = {
        "/": "#content-main",
        "/runs/": "#runs",
        "/pipelines/": "#content-main",
        "/pipelines/sample.studio/?plan=1": "#plan-tree [data-level]",  # the form, and the plan under it
        "/stands/": "#content-main",
        "/agents/": "#content-main",
        "/artifacts/": "#content-main",
        f"/artifacts/{artifact.pk}/": "#content-main",
        f"/topology/runs/{run.pk}/": "svg.studio-topology",
        "/topology/stands/sample.studio/": "#content-main",
        "/records/record/": f'[data-tree="{root.pk}"]',
        f"/records/record/{part.pk}/delete/": "#delete-preview [data-level]",
        # The admin's own pages the Studio keeps: change lists with actions, a read-only form.
        "/agents/agentcommand/": "#changelist",
        "/records/event/": "#changelist",
        "/secrets/secret/": "#changelist",
        f"/agents/agent/{agent.pk}/change/": "#agent_form",
    }
    for path, shown in pages.items():
        studio.open(path)
        studio.wait(functools.partial(shows, studio, shown), f"for {shown} on {path}")
        problems += refused(studio, path)

    # A trigger's Pause button: a form post under the policy, back on the pipeline's page.
    nightly = {"name": "nightly", "type": "cron", "schedule": "0 3 * * *", "timezone": "UTC", "missed": "skip"}
    triggers.triggers_reconcile(Pipeline.objects.get(name="sample.studio"), [{**nightly, "inputs": {}}])
    studio.open("/pipelines/sample.studio/")
    studio.click("#trigger-pause-nightly")
    studio.wait(lambda: studio.attributes("#trigger-nightly", "data-paused") == ["true"], "for the trigger to pause")
    assert "Paused: sample.studio/nightly starts nothing" in " ".join(studio.texts(".messagelist"))
    problems += refused(studio, "/pipelines/sample.studio/ (a trigger paused)")

    # The record inspector, tab by tab (each one an htmx swap of the tab's fragment).
    inspector = f"/records/record/{root.pk}/change/"
    studio.open(inspector)

    def on_tab(tab: str) -> None:
        studio.click(f"#tab-{tab}")
        studio.wait(lambda: studio.attributes("#record-tab", "data-tab") == [tab], f"for the {tab} tab")

    for tab in ("state", "events", "logs", "metrics", "traces"):
        on_tab(tab)
    studio.wait(
        lambda: "record_converge" in studio.texts("#record-tab .studio-span-name"),
        "for the parts' convergence in the waterfall",
    )
    bars = [float(width) for width in studio.attributes("#record-tab svg.studio-span-track rect", "width")]
    assert bars, "no bar in the waterfall"
    assert min(bars) > 0
    problems += refused(studio, inspector)

    # The start form still starts a run (a form post, then the new run's live page).
    studio.open("/pipelines/sample.studio/")
    parts_input = studio.driver.find_element("id", "input-parts")
    parts_input.clear()
    parts_input.send_keys("1")
    studio.click("#start")
    second = studio.wait(lambda: Run.objects.exclude(pk=run.pk).first(), "for the second run to start")
    studio.wait(lambda: studio.path() == f"/runs/{second.pk}/", "to land on the new run's page")
    studio.wait(lambda: any("line 0" in t for t in studio.texts(".studio-log-line")), "for its log")
    problems += refused(studio, f"/runs/{second.pk}/")
    wait_for(lambda: Run.objects.get(pk=second.pk).status == "suspended", what="the second run to sleep")

    assert problems == []
