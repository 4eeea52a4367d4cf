"""The Studio's triggers (Django's test client): a pipeline's page lists its triggers with what
they react to, whether and by whom they are paused, when they fire, the last run and the
webhook path, with their recent events; its Pause and Resume buttons call the service the API
calls, after the same checks. Runs show their cause, linked to the run that caused it."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from apps.pipelines import services
from apps.pipelines.models import Pipeline, Run, Trigger
from apps.pipelines.services import triggers
from tests import factories

pytestmark = pytest.mark.django_db

SPECS: list[dict[str, Any]] = [
    {"name": "nightly", "type": "cron", "schedule": "0 3 * * *", "timezone": "UTC", "inputs": {}, "missed": "skip"},
    {"name": "after-noop", "type": "upstream", "pipeline": "sample.noop", "on": "succeeded"},
    {"name": "push", "type": "webhook", "event": "push", "secret": "hook-secret"},
]


def with_triggers(name: str = "sample.wait") -> Pipeline:
    row = services.pipeline_sync(services.definition_get(name))
    triggers.triggers_reconcile(row, SPECS)
    return row


def page(client: Client, name: str = "sample.wait") -> str:
    response = client.get(f"/pipelines/{name}/")
    assert response.status_code == 200
    return response.content.decode()


def act(client: Client, trigger: Trigger, action: str) -> Any:
    return client.post(f"/pipelines/{trigger.pipeline.name}/triggers/{trigger.pk}/{action}/", follow=True)


def row_of(text: str, name: str) -> str:
    return text.split(f'id="trigger-{name}"')[1].split("</tr>")[0]


def test_the_pipeline_page_lists_its_triggers_and_pauses_and_resumes_them(studio: Client) -> None:
    with_triggers()
    nightly = Trigger.objects.get(name="nightly")
    shown = page(studio)
    assert 'id="triggers"' in shown
    cron = row_of(shown, "nightly")
    assert "cron 0 3 * * * (UTC, missed: skip)" in cron
    assert nightly.next_fire_at is not None
    assert f'next <time datetime="{nightly.next_fire_at.isoformat()}"' in cron
    assert 'id="trigger-pause-nightly"' in cron
    assert "upstream sample.noop on succeeded" in row_of(shown, "after-noop")
    assert "POST /hooks/sample.wait/push" in row_of(shown, "push")

    paused = act(studio, nightly, "pause")
    text = paused.content.decode()
    assert "Paused: sample.wait/nightly starts nothing" in text
    cron = row_of(text, "nightly")
    assert 'data-paused="true"' in text.split('id="trigger-nightly"')[0].rsplit("<tr", 1)[1] + cron
    assert "paused</span> by ada since" in cron
    assert 'id="trigger-resume-nightly"' in cron
    assert "not while paused" in cron
    nightly.refresh_from_db()
    assert nightly.paused
    assert nightly.paused_by is not None
    assert nightly.paused_by.get_username() == "ada"
    events = text.split('id="trigger-events-nightly"')[1].split("</details>")[0]
    assert "Paused" in events
    assert "by ada" in events

    # A stale page's button: the service's refusal is the message; nothing changes.
    again = act(studio, nightly, "pause").content.decode()
    assert "Pause: trigger sample.wait/nightly is paused already" in again

    resumed = act(studio, nightly, "resume").content.decode()
    assert "Resumed: sample.wait/nightly starts runs again." in resumed
    assert 'id="trigger-pause-nightly"' in row_of(resumed, "nightly")
    assert not Trigger.objects.get(pk=nightly.pk).paused
    assert studio.get(f"/pipelines/sample.wait/triggers/{nightly.pk}/pause/").status_code == 405
    assert studio.post(f"/pipelines/sample.wait/triggers/{nightly.pk}/stop/").status_code == 404
    assert studio.post(f"/pipelines/sample.noop/triggers/{nightly.pk}/pause/").status_code == 404


def test_a_viewer_sees_the_triggers_but_no_button_and_cannot_pause(django_user_model: Any) -> None:
    with_triggers()
    nightly = Trigger.objects.get(name="nightly")
    vera = django_user_model.objects.create_user(username="vera", password="pw")
    factories.bind(vera, "viewer")
    client = Client()
    client.force_login(vera)
    shown = page(client)
    assert 'id="trigger-nightly"' in shown
    assert 'id="trigger-pause-nightly"' not in shown
    refused = act(client, nightly, "pause").content.decode()
    assert "Pause: vera may not update pipelines in namespace &#x27;default&#x27;" in refused
    assert not Trigger.objects.get(pk=nightly.pk).paused


def test_runs_show_their_cause_linked_to_the_run_and_trigger_behind_it(studio: Client, user: Any) -> None:
    with_triggers()
    by_hand = services.run_start(pipeline_name="sample.noop", inputs={}, actor=user)
    upstream = Trigger.objects.get(name="after-noop")
    cause = {
        "type": "upstream",
        "trigger": "after-noop",
        "run": str(by_hand.pk),
        "name": str(by_hand),
        "status": "succeeded",
    }
    started = services.run_start(pipeline_name="sample.wait", inputs={}, cause=cause, trigger=upstream)
    assert Run.objects.get(pk=started.pk).cause == cause

    listed = studio.get("/runs/").content.decode()
    mine = listed.split(f'data-run="{by_hand.pk}"')[1].split("</tr>")[0]
    assert 'data-cause="user">user alice</span>' in mine
    theirs = listed.split(f'data-run="{started.pk}"')[1].split("</tr>")[0]
    assert f'run <a href="/runs/{by_hand.pk}/">{by_hand}</a> succeeded' in theirs
    assert '(trigger <a href="/pipelines/sample.wait/#trigger-after-noop">after-noop</a>)' in theirs

    run_page = studio.get(f"/runs/{started.pk}/").content.decode()
    cause_html = run_page.split('id="run-cause"')[1].split("</span></span>")[0]
    assert f'href="/runs/{by_hand.pk}/"' in cause_html
    assert 'data-cause="upstream"' in cause_html
    assert 'data-cause="user">user alice' in studio.get(f"/runs/{by_hand.pk}/").content.decode()
