"""The Studio's agents board and stands in a real browser (Debian's Chromium, headless)
against the real web server: an agent's card, an agent no form can edit, a stand holding
extended with a click."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from selenium.webdriver.remote.webdriver import WebDriver

from apps.agents import services as agents
from apps.agents.models import Agent
from apps.pipelines import services
from apps.records import services as records
from apps.records.models import Record
from tests.harness.browser import PASSWORD, Browser
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def studio(web: WebServer, chromium: WebDriver, django_user_model: Any) -> Browser:
    django_user_model.objects.create_superuser(username="ada", password=PASSWORD)
    return Browser(chromium, web.url)


def test_an_agents_card_shows_what_it_offers_and_no_form_edits_it(studio: Browser) -> None:
    owner = records.record_create_root(kind="graphene.run", name="fleet#1")
    agent = agents.agent_record_declare(owner=owner, name="builder-1", labels={"pool": "ci"})
    agents.capability_publish(agent=agent, name="docker", version="27.1")
    Agent.objects.filter(pk=agent.pk).update(peer="10.1.2.3")
    studio.log_in("ada", "/agents/")
    card = f'[data-agent="{agent.pk}"]'
    studio.wait(lambda: studio.texts(f"{card} h2"), "for the agent's card")
    assert "builder-1" in studio.texts(f"{card} h2")[0]
    assert studio.texts(f'{card} [data-capability="docker"]') == ["docker 27.1"]
    assert studio.attributes(f"{card} [data-status]", "data-status") == ["disconnected"]
    studio.screenshot("agents-board")

    studio.open(f"/agents/agent/{agent.pk}/change/")
    studio.wait(lambda: studio.texts("#content-main"), "for the agent's admin page")
    fields = studio.attributes("#content-main input:not([type=hidden]), #content-main textarea", "name")
    assert fields == [], f"the agent's page offers a form: {fields}"
    assert "10.1.2.3" in " ".join(studio.texts("#content-main"))  # shown, not editable
    assert studio.attributes('#content-main [type="submit"]', "name") == []
    studio.screenshot("agent-read-only")


def test_a_stand_holding_is_extended_with_a_click(studio: Browser) -> None:
    stand = services.stand_get("sample.handoff")
    root = records.record_create_root(kind="graphene.run", name="sample.handoff#1")
    held = records.record_declare(kind="test.sleep", name="db", owner=root)
    records.record_transfer(record=held, new_owner=stand, expires_at=timezone.now() + timedelta(minutes=30))
    studio.log_in("ada", "/stands/")
    row = f'tr[data-record="{held.pk}"]'
    studio.wait(lambda: studio.texts(row), "for the holding's row")
    countdown = studio.texts(f"{row} .studio-ttl")[0]
    studio.click(f'{row} button[value="1d"]')
    studio.wait(
        lambda: studio.texts(".messagelist") and "now expires at" in studio.texts(".messagelist")[0],
        "for the extension to be confirmed",
    )
    after = Record.objects.get(pk=held.pk).expires_at
    assert after is not None
    assert after > timezone.now() + timedelta(hours=24)
    assert studio.texts(f"{row} .studio-ttl")[0] != countdown
    studio.screenshot("stand-extended")
