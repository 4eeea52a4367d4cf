"""The scheduler's tick keeps cron instants on time: a tick that fires an instant late (it came
between two ticks, unscheduled) asks a worker for the next one at its exact time, so one late
instant does not make every later one wait for a tick too."""

from __future__ import annotations

import textwrap
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from graphene_sdk import _delivery
from rest_framework.test import APIClient

from apps.pipelines.models import Trigger, TriggerFiring
from apps.pipelines.services import triggers
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]

EVERY_SECOND = """
from pydantic import BaseModel
from graphene_sdk import Context, cron, pipeline


class In(BaseModel):
    label: str = ""


@pipeline("t-second", inputs=In, triggers=[cron("* * * * * *", inputs={"label": "second"}, name="second")])
def second(ctx: Context, inputs: In) -> str:
    return inputs.label
"""


def push(api: APIClient, base: Path) -> None:
    root = base / f"code-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    (root / "flows.py").write_text(textwrap.dedent(EVERY_SECOND))
    data = _delivery.pack(root, max_bytes=10 * 1024**2)
    answer = api.generic("POST", "/api/v1/revisions/?namespace=default", data, content_type="application/gzip")  # type: ignore[arg-type]
    assert answer.status_code in (200, 201), answer.content


def test_a_tick_that_fires_a_late_instant_schedules_the_next_one_at_its_time(
    api: APIClient, tmp_path: Path, workers: Any
) -> None:
    push(api, tmp_path)
    trigger = Trigger.objects.get(pipeline__name="t-second", name="second")
    late = trigger.next_fire_at
    assert late is not None
    # No scheduler runs: the first instant passes unscheduled, as between two ticks.
    wait_for(lambda: timezone.now() > late + timedelta(milliseconds=200), timeout=5, what="the instant to pass")
    triggers.triggers_tick()
    wait_for(
        lambda: TriggerFiring.objects.filter(trigger=trigger, key=late.isoformat(), status="started").exists(),
        timeout=10,
        what=f"the late instant {late} to fire",
    )
    # No other tick comes: only the one above can have asked a worker for the next instant.
    following = late + timedelta(seconds=1)
    wait_for(
        lambda: TriggerFiring.objects.filter(trigger=trigger, key=following.isoformat(), status="started").exists(),
        timeout=10,
        what=f"the instant {following} to fire without another tick",
    )
    firing = TriggerFiring.objects.get(trigger=trigger, key=following.isoformat())
    assert firing.created_at >= following, "fired before its instant"
    assert firing.cause["instant"] == following.isoformat()
