"""Stands and handoff, ownership in code, concurrency policies and child runs.

Ownership and handoff are engine semantics, driven in-process (``drive``); the concurrency
policies and child runs are about runs executing at the same time, on real worker processes.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from graphenectl._resources import PIPELINE_COLUMNS
from rest_framework.test import APIClient

from apps.core.errors import Conflict
from apps.pipelines import services
from apps.pipelines.choices import RunStatus
from apps.pipelines.models import Run
from apps.pipelines.tasks import run_execute_task
from apps.records import services as records
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from kinds.testing import objects_of
from tests.conftest import Worker, wait_for
from tests.harness.driver import Driver
from tests.pipelines.sample import effects_file
from tests.pipelines.test_runs import driven, finished, start
from tests.sdk.test_contract import run_mypy

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def names_under(record: Record) -> set[str]:
    fresh = Record.objects.get(pk=record.pk)
    return {r.name for r in fresh.get_descendants().exclude(phase=Phase.DELETED)}


def by_name(run: Run, name: str) -> Record:
    return Record.objects.get(created_by_run_id=run.record_id, name=name)


def test_handoff_survives_the_run_and_its_ttl_deletes_it_children_first(drive: Driver, api: APIClient) -> None:
    run = driven(drive, start("sample.handoff", keep_seconds=3600))
    assert run.status == RunStatus.SUCCEEDED, run.error
    stand = services.stand_get("sample.handoff")
    drive.run_until(lambda: by_name(run, "net").phase == Phase.DELETED, what="the rest of the run's tree to be deleted")
    assert by_name(run, "app").phase == Phase.DELETED
    assert names_under(stand) == {"db", "data"}
    db, data = by_name(run, "db"), by_name(run, "data")
    assert db.phase == Phase.READY
    assert data.phase == Phase.READY
    assert db.expires_at is not None

    listing = api.get("/api/v1/stands/").json()
    assert {"pipeline": "sample.handoff", "holdings": 1} in [
        {k: s[k] for k in ("pipeline", "holdings")} for s in listing
    ]
    detail = api.get("/api/v1/stands/sample.handoff/").json()
    assert [h["name"] for h in detail["holdings"]] == ["db"]
    assert detail["holdings"][0]["subtree_records"] == 2
    extended = api.post(
        "/api/v1/stands/sample.handoff/extend/", {"record": str(db.pk), "by_seconds": 60}, format="json"
    )
    assert extended.status_code == 200, extended.content
    bad = api.post(
        "/api/v1/stands/sample.handoff/extend/", {"record": str(run.record_id), "by_seconds": 60}, format="json"
    )
    assert bad.status_code == 400

    # The TTL runs out (the beat's body, at a moment past the deadline): children first.
    records.records_expire(now=timezone.now() + timedelta(hours=2))
    drive.run_until(lambda: Record.objects.get(pk=db.pk).phase == Phase.DELETED, what="the held subtree to expire")
    deleted_at = {r.name: r.deleted_at for r in Record.objects.filter(pk__in=[db.pk, data.pk])}
    assert deleted_at["data"] is not None
    assert deleted_at["db"] is not None
    assert deleted_at["data"] <= deleted_at["db"]
    assert objects_of(str(db.pk)) == []
    assert objects_of(str(data.pk)) == []


def test_a_second_run_replaces_the_holding_or_is_told_how(drive: Driver) -> None:
    first = driven(drive, start("sample.handoff"))
    assert first.status == RunStatus.SUCCEEDED, first.error
    old_db, old_data = by_name(first, "db"), by_name(first, "data")

    # Without replace: the stand keeps what it has, and the error says what to do.
    clash = driven(drive, start("sample.handoff"))
    assert clash.status == RunStatus.FAILED
    assert f"the stand 'sample.handoff' already holds a test.sleep/db ({old_db.pk}" in clash.error
    assert "replace=True" in clash.error
    assert f"graphenectl delete {old_db.pk}" in clash.error
    assert Record.objects.get(pk=old_db.pk).phase == Phase.READY

    # With it: the new db (with its child) takes the name; the old one is deleted, children first.
    second = driven(drive, start("sample.handoff", replace=True))
    assert second.status == RunStatus.SUCCEEDED, second.error
    stand = services.stand_get("sample.handoff")
    new_db = by_name(second, "db")
    assert Record.objects.get(pk=new_db.pk).parent_id == stand.pk
    drive.run_until(
        lambda: Record.objects.get(pk=old_db.pk).phase == Phase.DELETED, what="the replaced holding to be deleted"
    )
    old = {r.name: r for r in Record.objects.filter(pk__in=[old_db.pk, old_data.pk])}
    assert old["data"].deleted_at is not None
    assert old["data"].deleted_at <= old["db"].deleted_at  # type: ignore[operator]
    requested = Event.objects.get(record=old_db, type=EventType.DELETION_REQUESTED)
    assert requested.reason == "Replaced"
    assert str(new_db.pk) in requested.message
    assert names_under(stand) == {"db", "data"}
    assert [r.pk for r in Record.objects.filter(parent=stand, name="db").exclude(phase=Phase.DELETED)] == [new_db.pk]


def test_release_keeps_a_holding_without_expiry(drive: Driver, api: APIClient) -> None:
    run = driven(drive, start("sample.handoff", keep_seconds=60))
    db = by_name(run, "db")
    released = api.post("/api/v1/stands/sample.handoff/release/", {"record": str(db.pk)}, format="json")
    assert released.status_code == 200
    assert released.json()["expires_at"] is None
    assert records.records_expire(now=timezone.now() + timedelta(days=30)) == 0


def test_a_failed_run_keeps_its_environment_on_the_stand(drive: Driver) -> None:
    run = driven(drive, start("sample.keep"))
    assert run.status == RunStatus.FAILED
    assert "the smoke test failed" in run.error
    assert "kept 1 record(s) on the stand" in run.error
    env = by_name(run, "env")
    stand = services.stand_get("sample.keep")
    assert Record.objects.get(pk=env.pk).parent_id == stand.pk
    assert names_under(stand) == {"env", "inner"}
    assert env.expires_at is not None
    assert timedelta(minutes=59) < env.expires_at - timezone.now() <= timedelta(hours=1)
    root = Record.objects.get(kind="graphene.run", name=f"sample.keep#{run.number}")
    drive.run_until(lambda: Record.objects.get(pk=root.pk).phase == Phase.DELETED, what="the emptied run root to go")


def test_queue_runs_one_at_a_time_in_order_and_bounds_the_line(workers: list[Worker], api: APIClient) -> None:
    runs = [start("sample.queue", label=label, seconds=0.6) for label in "abc"]
    first, *rest = [Run.objects.get(pk=r.pk).status for r in runs]
    assert first in {"queued", "running"}  # a worker may have taken it already
    assert rest == ["waiting", "waiting"]
    with pytest.raises(Conflict, match="max_pending=2"):
        start("sample.queue", label="d")
    refused = api.post("/api/v1/pipelines/sample.queue/runs/", {"inputs": {"label": "e"}}, format="json")
    assert refused.status_code == 409
    assert refused.json()["error"] == "concurrency_limit"
    assert Run.objects.filter(pipeline__name="sample.queue").count() == 3
    # The bound is shown where the policy is.
    shown = api.get("/api/v1/pipelines/sample.queue/").json()
    assert (shown["concurrency"], shown["max_pending"]) == ("queue", 2)
    assert PIPELINE_COLUMNS[1].value(shown) == "queue (at most 2 waiting)"
    for run in runs:
        assert finished(run).status == RunStatus.SUCCEEDED
    lines = effects_file("queue", "order").read_text().split()
    events = [(lines[i], lines[i + 1], float(lines[i + 2])) for i in range(0, len(lines), 3)]
    assert [(kind, label) for kind, label, _ in events] == [
        ("start", "a"), ("end", "a"), ("start", "b"), ("end", "b"), ("start", "c"), ("end", "c"),
    ]  # fmt: skip


def test_cancel_previous_cancels_and_cleans_the_running_one(workers: list[Worker]) -> None:
    first = start("sample.replace")
    wait_for(lambda: Run.objects.get(pk=first.pk).status == RunStatus.SUSPENDED, what="the first to hold its record")
    deployment = by_name(first, "deployment")
    second = start("sample.replace")
    first = Run.objects.get(pk=first.pk)
    assert first.status == RunStatus.CANCELLED
    assert "newer run" in first.error
    wait_for(lambda: Record.objects.get(pk=deployment.pk).phase == Phase.DELETED, what="the first run's cleanup")
    assert objects_of(str(deployment.pk)) == []
    assert Run.objects.get(pk=second.pk).status in {RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.SUSPENDED}
    services.run_cancel(run=second)


def _spans(tag: str) -> list[tuple[float, float]]:
    lines = effects_file(tag, "spans").read_text().split()
    starts = {lines[i + 1]: float(lines[i + 2]) for i in range(0, len(lines), 3) if lines[i] == "start"}
    ends = {lines[i + 1]: float(lines[i + 2]) for i in range(0, len(lines), 3) if lines[i] == "end"}
    return [(starts[k], ends[k]) for k in starts if k in ends]


def test_run_all_never_exceeds_its_concurrency(start_worker: Any) -> None:
    for _ in range(3):
        start_worker(concurrency=2)
    parent = finished(start("sample.parent", count=10, concurrency=3, seconds=0.4, tag="limit"), timeout=120)
    assert parent.status == RunStatus.SUCCEEDED, parent.error
    assert parent.outputs == {"squares": [i * i for i in range(10)], "failed": {}}
    children = Run.objects.filter(parent_run=parent)
    assert children.count() == 10
    assert {c.status for c in children} == {RunStatus.SUCCEEDED}
    spans = _spans("limit")
    assert len(spans) == 10
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert most <= 3, f"{most} children ran at once"
    assert most >= 2, "children ran in parallel"


def test_failed_children_are_told_by_the_position_of_their_inputs(drive: Driver) -> None:
    parent = driven(drive, start("sample.parent", count=4, concurrency=2, seconds=0, failing=[1, 3]))
    assert parent.status == RunStatus.SUCCEEDED, parent.error
    assert parent.outputs is not None
    failed = parent.outputs["failed"]
    assert sorted(failed) == ["1", "3"]  # ChildRunFailed.by_input, through JSON
    assert "RuntimeError: child 1 was told to fail" in failed["1"]
    assert "child 3 was told to fail" in failed["3"]
    children = {c.number: c for c in Run.objects.filter(parent_run=parent)}
    assert sorted(c.status for c in children.values()).count(RunStatus.FAILED) == 2


def test_cancelling_the_parent_cancels_and_cleans_every_child(workers: list[Worker]) -> None:
    parent = start("sample.parent", count=10, concurrency=3, seconds=4, tag="cancelled")
    wait_for(lambda: Run.objects.filter(parent_run=parent, status=RunStatus.RUNNING).count() >= 1, what="children")
    services.run_cancel(run=parent)
    children = list(Run.objects.filter(parent_run=parent))
    assert len(children) == 10
    assert {c.status for c in children} == {RunStatus.CANCELLED}
    scratch = Record.objects.filter(created_by_run_id__in=[c.record_id for c in children])
    wait_for(lambda: not scratch.exclude(phase=Phase.DELETED).exists(), timeout=60, what="children's records deleted")
    assert all(objects_of(str(r.pk)) == [] for r in scratch)


def test_attach_waits_read_only_on_another_runs_record(drive: Driver) -> None:
    stand = records.record_create_root(kind="graphene.stand", name="shared")
    slow = records.record_declare(kind="test.sleep", name="shared-db", owner=stand, spec={"create_ms": 1500})
    run = start("sample.attach", record_id=str(slow.pk))
    # The run goes before the record's create (sent first): it finds the record not ready and waits.
    drive.run_until(
        lambda: Run.objects.get(pk=run.pk).status == RunStatus.SUSPENDED,
        what="waiting on the attached record",
        only=run_execute_task.name,
    )
    run = driven(drive, run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert Record.objects.get(pk=slow.pk).phase == Phase.READY, "attached records are not the run's to delete"
    assert Record.objects.get(pk=slow.pk).parent_id == stand.pk


def test_children_option_gives_records_to_the_new_owner(drive: Driver) -> None:
    run = driven(drive, start("sample.adopt"))
    assert run.status == RunStatus.SUCCEEDED, run.error
    group = by_name(run, "group")
    assert names_under(group) == {"first", "second"}
    assert Record.objects.get(pk=group.pk).parent_id == services.stand_get("sample.adopt").pk
    given = Event.objects.filter(
        record__name="first", type=EventType.TRANSFERRED_IN, record__created_by_run_id=run.record_id
    )
    assert given.count() == 1  # given to the group; later it moved to the stand inside the group's subtree
    assert given.get().data["to"] == str(group.pk)


@pytest.mark.xdist_group("mypy")  # the tests that run mypy share its cache: one worker runs them
def test_mypy_rejects_an_attached_handle_as_owner(tmp_path: Path) -> None:
    program = """
        from graphene_sdk import Context, pipeline
        from pydantic import BaseModel

        class Inputs(BaseModel):
            record: str

        @pipeline("uses-attached", inputs=Inputs)
        def uses(ctx: Context, inputs: Inputs) -> None:
            other = ctx.attach(inputs.record)
            ctx.declare("test.sleep", "x", parent=other)
    """
    result = run_mypy(tmp_path, program)
    assert result.returncode == 1, result.stdout
    assert 'Argument "parent" to "declare" of "Context" has incompatible type "Attached"' in result.stdout
