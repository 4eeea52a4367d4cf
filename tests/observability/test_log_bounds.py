"""Log bounds: lines past a record's cap or older than the retention go, counted and told."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.observability.models import LogDrop, LogLine
from apps.observability.services import LogEntry, log_write_many, logs_trim
from apps.records.choices import EventType
from apps.records.models import Event
from tests import factories

pytestmark = pytest.mark.django_db


def lines(record: Any, count: int, prefix: str, **entry: Any) -> None:
    log_write_many(LogEntry(record_id=record.pk, message=f"{prefix} {n}", **entry) for n in range(count))


def messages(record: Any) -> list[str]:
    return list(LogLine.objects.filter(record=record).order_by("id").values_list("message", flat=True))


def test_a_record_keeps_its_newest_lines_and_the_rest_is_counted_and_told(settings: Any, api: Any) -> None:
    settings.GRAPHENE_LOG_MAX_LINES_PER_RECORD = 5
    run = factories.run()
    chatty, quiet = factories.sleep(run, "chatty"), factories.sleep(run, "quiet")
    lines(chatty, 8, "chatty")
    lines(quiet, 3, "quiet")
    assert logs_trim() == {"aged": 0, "bounded": 3, "records": 1}
    assert messages(chatty) == [f"chatty {n}" for n in range(3, 8)]
    assert messages(quiet) == ["quiet 0", "quiet 1", "quiet 2"]
    assert LogDrop.objects.get(record=chatty).lines == 3
    [told] = Event.objects.filter(record=chatty, type=EventType.LOGS_TRIMMED)
    assert told.data == {"lines": 3}

    own = api.get(f"/api/v1/records/{chatty.pk}/logs/?descendants=false").json()
    assert own["dropped"] == 3
    assert api.get(f"/api/v1/records/{quiet.pk}/logs/?descendants=false").json()["dropped"] == 0
    assert api.get(f"/api/v1/records/{run.pk}/logs/?tail=2").json()["dropped"] == 3, "a run's view covers its subtree"

    # Nothing new written: the next check looks at no record and tells nothing.
    assert logs_trim() == {"aged": 0, "bounded": 0, "records": 0}
    lines(chatty, 2, "more")
    assert logs_trim()["bounded"] == 2
    assert LogDrop.objects.get(record=chatty).lines == 5
    assert messages(chatty)[-2:] == ["more 0", "more 1"]


def test_lines_older_than_the_retention_go(settings: Any) -> None:
    settings.GRAPHENE_LOG_RETENTION = timedelta(days=30)
    run = factories.run()
    lines(run, 4, "old", at=timezone.now() - timedelta(days=31))
    lines(run, 2, "new")
    assert logs_trim()["aged"] == 4
    assert messages(run) == ["new 0", "new 1"]
    assert LogDrop.objects.get(record=run).lines == 4
