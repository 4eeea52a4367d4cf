"""Drift: the scheduler observes ready records through an index, heals or reports differences.

Service-level tests drive one observation at a time; the last test runs the real thing — a
worker process and a ``celery beat`` — against a file changed behind Graphene's back.
"""

from __future__ import annotations

import os
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from apps.core.errors import ValidationFailed
from apps.records import services
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from tests import factories
from tests.conftest import Worker, running_beat, wait_for

pytestmark = pytest.mark.django_db


def declare_file(capture: Any, name: str, content: str = "port=80\n", **options: Any) -> Record:
    owner = factories.stand(f"drift-{name}")
    with capture(execute=True):
        record = services.record_declare(
            kind="file",
            name=name,
            owner=owner,
            spec={"path": f"drift/{uuid.uuid4()}.conf", "content": content},
            **options,
        )
    record.refresh_from_db()
    assert record.phase == Phase.READY, record.last_error
    return record


def drift_events(record: Record) -> list[Event]:
    return list(Event.objects.filter(record=record, type=EventType.DRIFT_DETECTED).order_by("id"))


def test_a_ready_record_is_scheduled_soon_after_it_changed(
    eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    before = timezone.now()
    record = declare_file(django_capture_on_commit_callbacks, "soon")
    assert record.next_observe_at is not None
    # The file kind observes every 60 s; just after a change, after a tenth of that.
    assert before + timedelta(seconds=5) <= record.next_observe_at <= timezone.now() + timedelta(seconds=7)
    every = declare_file(django_capture_on_commit_callbacks, "every", observe_every=600)
    assert every.observe_every == 600
    assert every.next_observe_at is not None
    assert every.next_observe_at >= before + timedelta(seconds=60)
    # Kinds with nothing outside are never observed.
    assert record.parent is not None
    assert Record.objects.get(pk=record.parent.pk).next_observe_at is None


def test_changed_content_is_healed_and_counted(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    record = declare_file(django_capture_on_commit_callbacks, "heal")
    path = Path(record.outputs["path"])
    assert services.records_observe(record_ids=[record.pk])["clean"] == 1
    assert drift_events(record) == []

    path.write_text("port=8080\n")  # behind Graphene's back
    with django_capture_on_commit_callbacks(execute=True):
        counts = services.records_observe(record_ids=[record.pk])
    assert counts["healing"] == 1
    record.refresh_from_db()
    assert record.phase == Phase.READY
    assert record.heals == 1
    assert not record.healing
    assert path.read_text() == "port=80\n"
    [event] = drift_events(record)
    assert event.reason == "Drifted"
    assert [c["field"] for c in event.data["changes"]] == ["content"]
    assert event.data["policy"] == "heal"
    moves = [
        (e.data["from"], e.data["to"], e.reason)
        for e in Event.objects.filter(record=record, type=EventType.PHASE_CHANGED).order_by("id")
    ]
    assert moves[-2:] == [("ready", "updating", "Healing"), ("updating", "ready", "Healed")]

    path.unlink()  # deleted out of band: re-created
    with django_capture_on_commit_callbacks(execute=True):
        services.records_observe(record_ids=[record.pk])
    record.refresh_from_db()
    assert (record.phase, record.heals) == (Phase.READY, 2)
    assert path.read_text() == "port=80\n"
    assert drift_events(record)[-1].reason == "Gone"


def test_report_policy_marks_drifted_once_and_recovers(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    record = declare_file(django_capture_on_commit_callbacks, "report", drift_policy="report")
    path = Path(record.outputs["path"])
    saved = path.read_bytes()
    os.chmod(path, 0o600)
    for _ in range(3):
        with django_capture_on_commit_callbacks(execute=True):
            services.records_observe(record_ids=[record.pk])
    record.refresh_from_db()
    assert record.phase == Phase.DRIFTED
    assert record.heals == 0
    assert oct(path.stat().st_mode & 0o777) == oct(0o600), "report never touches the object"
    [event] = drift_events(record)  # one event, not one per look
    assert event.data["changes"] == [{"field": "mode", "desired": 0o644, "actual": 0o600}]
    assert record.next_observe_at is not None, "a drifted record is still watched"

    os.chmod(path, 0o644)
    assert path.read_bytes() == saved
    services.records_observe(record_ids=[record.pk])
    record.refresh_from_db()
    assert record.phase == Phase.READY
    last = Event.objects.filter(record=record, type=EventType.PHASE_CHANGED).order_by("id").last()
    assert last is not None
    assert last.reason == "DriftResolved"


def test_the_scheduler_claims_only_due_records_and_forgets_the_unobservable(
    eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    due = declare_file(django_capture_on_commit_callbacks, "due")
    later = declare_file(django_capture_on_commit_callbacks, "later")
    gone = declare_file(django_capture_on_commit_callbacks, "being-deleted")
    now = timezone.now()
    Record.objects.filter(pk__in=[due.pk, gone.pk]).update(next_observe_at=now - timedelta(seconds=1))
    Record.objects.filter(pk=later.pk).update(next_observe_at=now + timedelta(minutes=5))
    Record.objects.filter(pk=gone.pk).update(deletion_requested_at=now)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.records_observe_due(now=now) == 2
    due.refresh_from_db()
    assert due.observed_at is not None
    assert due.next_observe_at is not None
    assert due.next_observe_at >= now + timedelta(seconds=59)
    assert Record.objects.get(pk=gone.pk).next_observe_at is None, "out of the index for good"
    assert Record.objects.get(pk=later.pk).observed_at == later.observed_at
    with django_capture_on_commit_callbacks(execute=True):
        assert services.records_observe_due(now=now) == 0


def test_drift_options_are_validated_and_kept_on_redeclaration(django_capture_on_commit_callbacks: Any) -> None:
    owner = factories.stand("drift-options")
    spec = {"path": f"drift/{uuid.uuid4()}.conf", "content": "x"}
    with pytest.raises(ValidationFailed) as bad:
        services.record_declare(kind="file", name="o", owner=owner, spec=spec, drift_policy="ignore")
    assert "on_drift" in bad.value.fields
    with pytest.raises(ValidationFailed) as bad:
        services.record_declare(kind="file", name="o", owner=owner, spec=spec, observe_every=0.5)
    assert "reconcile_every" in bad.value.fields
    assert not Record.objects.filter(name="o").exists(), "nothing half-created"
    with django_capture_on_commit_callbacks(execute=False):
        first = services.record_declare(kind="file", name="o", owner=owner, spec=spec)
        again = services.record_declare(
            kind="file", name="o", owner=owner, spec=spec, drift_policy="report", observe_every=30
        )
    assert again.pk == first.pk
    stored = Record.objects.get(pk=first.pk)
    assert (stored.drift_policy, stored.observe_every, stored.generation) == ("report", 30, 1)


def test_api_apply_takes_drift_options(api: Any) -> None:
    owner = factories.stand()
    body = {
        "kind": "file",
        "name": "api",
        "owner": str(owner.pk),
        "spec": {"path": f"drift/{uuid.uuid4()}.conf", "content": "x"},
        "on_drift": "report",
        "reconcile_every_seconds": 15,
    }
    response = api.post("/api/v1/records/", body, format="json")
    assert response.status_code == 201, response.json()
    assert (response.json()["drift_policy"], response.json()["observe_every"]) == ("report", 15)
    bad = api.post("/api/v1/records/", {**body, "name": "bad", "on_drift": "ignore"}, format="json")
    assert bad.status_code == 400
    assert "on_drift" in bad.json()["fields"]


@pytest.mark.django_db(transaction=True)
def test_a_file_changed_behind_our_back_is_healed_by_beat_and_a_worker(workers: list[Worker], tmp_path: Path) -> None:
    owner = factories.stand()
    record = services.record_declare(
        kind="file",
        name="watched",
        owner=owner,
        spec={"path": f"drift/{uuid.uuid4()}.conf", "content": "mode=prod\n"},
        observe_every=2,
    )
    wait_for(lambda: Record.objects.get(pk=record.pk).phase == Phase.READY, what="the file to be created")
    path = Path(Record.objects.get(pk=record.pk).outputs["path"])
    path.write_text("mode=debug\n")
    with running_beat(tmp_path):
        healed = wait_for(
            lambda: Record.objects.filter(pk=record.pk, heals=1, phase=Phase.READY).first(),
            timeout=40,
            what=f"the heal of {record} by a worker",
        )
    assert path.read_text() == "mode=prod\n"
    assert healed is not None
    assert healed.observed_at is not None
    assert [e.reason for e in drift_events(record)] == ["Drifted"]
