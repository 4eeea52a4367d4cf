"""The stands page in a real browser (Debian's Chromium, headless) against the real web
server: a holding's TTL extended, then released, with the buttons a person clicks."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from selenium.webdriver.remote.webdriver import WebDriver

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


def test_extend_then_release_a_stand_holding(studio: Browser) -> None:
    stand = services.stand_get("sample.handoff")
    run_root = records.record_create_root(kind="graphene.run", name="sample.handoff#1")
    held = records.record_declare(kind="test.sleep", name="db", owner=run_root)
    records.record_transfer(record=held, new_owner=stand, expires_at=timezone.now() + timedelta(minutes=30))
    studio.log_in("ada", "/stands/")
    row = f'[data-stand="sample.handoff"] tr[data-record="{held.pk}"]'
    studio.wait(lambda: " min " in studio.texts(f"{row} .studio-ttl")[0], "for the holding's countdown")

    studio.click(f'{row} button[value="1d"]')
    studio.wait(lambda: studio.texts(f"{row} .studio-ttl")[0].startswith("1 d"), "for the countdown to show a day more")
    expires = Record.objects.get(pk=held.pk).expires_at
    assert expires is not None
    assert expires > timezone.now() + timedelta(days=1)
    studio.screenshot("stand-holding-extended")

    studio.click(f'{row} button[value="release"]')
    studio.wait(lambda: studio.texts(f"{row} .studio-ttl") == ["no TTL"], "for the holding to have no TTL")
    assert Record.objects.get(pk=held.pk).expires_at is None
    assert not studio.texts(f'{row} button[value="release"]'), "nothing left to release"
    studio.screenshot("stand-holding-released")
