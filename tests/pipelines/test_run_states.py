"""A run's status moves through one checked service and leaves a trail: every move is a
``RunEvent`` (from, to, why, who), illegal moves are refused and change nothing."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.core.errors import Conflict
from apps.pipelines import services
from apps.pipelines.choices import RUN_TRANSITIONS, RunStatus
from apps.pipelines.models import Run, RunEvent
from tests import factories

pytestmark = pytest.mark.django_db


def history(run: Run) -> list[tuple[str, str, str, str | None]]:
    return [
        (e.from_status, e.to_status, e.reason, e.actor.get_username() if e.actor else None)
        for e in RunEvent.objects.filter(run=run).select_related("actor").order_by("id")
    ]


def test_a_run_that_waits_and_succeeds_leaves_every_move(user: Any) -> None:
    run = services.run_start(pipeline_name="sample.wait", inputs={}, actor=user)
    acquired = services.run_lease_acquire(run_id=run.pk)
    assert acquired is not None
    run, token = acquired
    target = str(uuid.uuid4())  # nothing settles it but the wake below
    services.run_suspend(run_id=run.pk, token=token, waiting_on=[target], wake_at=None)
    assert Run.objects.get(pk=run.pk).status == RunStatus.SUSPENDED
    assert services.runs_wake(targets=[target]) == 1
    acquired = services.run_lease_acquire(run_id=run.pk)
    assert acquired is not None
    run, token = acquired
    assert services.run_lease_acquire(run_id=run.pk) is None, "a running run with a live lease is not taken twice"
    assert services.run_finish(run=run, status=RunStatus.SUCCEEDED, outputs={"ok": True}, token=token)
    assert history(run) == [
        ("", "queued", "Started", "alice"),
        ("queued", "running", "Started", None),
        ("running", "suspended", "Suspended", None),
        ("suspended", "queued", "Woken", None),
        ("queued", "running", "Continued", None),
        ("running", "succeeded", "Succeeded", None),
    ]
    suspended = RunEvent.objects.get(run=run, to_status="suspended")
    assert suspended.data == {"waiting_on": [target], "wake_at": None}
    assert RunEvent.objects.filter(run=run, to_status="running").last().data == {"attempt": 2}  # type: ignore[union-attr]


def test_an_illegal_move_is_refused_and_changes_nothing(user: Any) -> None:
    run = services.run_start(pipeline_name="sample.wait", inputs={}, actor=user)
    services.run_cancel(run=run, actor=user)
    before = history(run)
    for to in (RunStatus.RUNNING, RunStatus.SUSPENDED, RunStatus.SUCCEEDED, RunStatus.FAILED):
        assert to not in RUN_TRANSITIONS[RunStatus.CANCELLED]
        with pytest.raises(services.IllegalRunTransition, match=f"cannot go from cancelled to {to}"):
            services.run_transition(run=services.run_lock(run.pk), to=to, reason="Test")
        assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED
        assert history(run) == before
    assert services.run_finish(run=run, status=RunStatus.TIMED_OUT) is False, "an ended run does not end twice"
    assert history(run) == before


def test_every_status_has_its_moves_and_succeeded_is_final() -> None:
    assert set(RUN_TRANSITIONS) == set(RunStatus.values)
    assert RUN_TRANSITIONS[RunStatus.SUCCEEDED] == frozenset()
    for moves in RUN_TRANSITIONS.values():
        assert moves <= set(RunStatus.values)


def test_who_cancelled_and_who_resumed_and_why_it_failed(user: Any, django_user_model: Any) -> None:
    bob = django_user_model.objects.create_user(username="bob", password="pw")
    factories.bind(bob, "developer")
    run = services.run_start(pipeline_name="sample.wait", inputs={}, actor=user)
    services.run_cancel(run=run, actor=user)
    services.run_resume(run=run, actor=bob)
    acquired = services.run_lease_acquire(run_id=run.pk)
    assert acquired is not None
    run, token = acquired
    error = "Traceback (most recent call last):\n  File ...\nValueError: the database said no"
    services.run_finish(run=run, status=RunStatus.FAILED, error=error, token=token)
    events = list(RunEvent.objects.filter(run=run).order_by("id"))
    cancelled = events[1]
    assert (cancelled.to_status, cancelled.reason, cancelled.actor, cancelled.message) == (
        "cancelled",
        "Cancelled",
        user,
        "cancelled by alice",
    )
    resumed = events[2]
    assert (resumed.from_status, resumed.to_status, resumed.reason, resumed.actor) == (
        "cancelled",
        "queued",
        "Resumed",
        bob,
    )
    failed = next(e for e in events if e.to_status == "failed")
    assert (failed.reason, failed.message) == ("Failed", "ValueError: the database said no")


def test_a_succeeded_run_cannot_be_resumed_and_the_refusal_leaves_no_event(user: Any) -> None:
    run = services.run_start(pipeline_name="sample.wait", inputs={}, actor=user)
    acquired = services.run_lease_acquire(run_id=run.pk)
    assert acquired is not None
    services.run_finish(run=acquired[0], status=RunStatus.SUCCEEDED, token=acquired[1])
    before = history(run)
    with pytest.raises(Conflict, match="succeeded; start a new run"):
        services.run_resume(run=run, actor=user)
    assert history(run) == before


def test_a_parent_ending_cancels_its_children_with_the_reason(user: Any) -> None:
    parent = services.run_start(pipeline_name="sample.wait", inputs={}, actor=user)
    children = services.run_start_children(
        parent=parent, pipeline_name="sample.child", inputs=[{"index": 0}, {"index": 1}], concurrency=1, group=1
    )
    assert [c.status for c in children] == [RunStatus.QUEUED, RunStatus.WAITING]
    assert [history(c)[0][2] for c in children] == ["Started", "WaitingForSiblings"]
    services.run_cancel(run=parent, actor=user)
    for child in children:
        last = RunEvent.objects.filter(run=child).order_by("id").last()
        assert last is not None
        assert (last.to_status, last.reason) == ("cancelled", "ParentEnded")
        # Runs are named pipeline#number in every message, never by the pipeline's row id.
        assert Run.objects.get(pk=child.pk).error == f"its parent run sample.wait#{parent.number} ended (cancelled)"


def test_a_child_run_names_its_parent_and_the_parent_finds_its_children(api: APIClient, user: Any) -> None:
    parent = services.run_start(pipeline_name="sample.wait", inputs={}, actor=user)
    children = services.run_start_children(
        parent=parent, pipeline_name="sample.child", inputs=[{"index": 0}, {"index": 1}], concurrency=2, group=1
    )
    services.run_start(pipeline_name="sample.child", inputs={"index": 9}, actor=user)  # not a child
    body = api.get(f"/api/v1/runs/{children[0].pk}/").json()
    assert (body["parent"], body["parent_name"]) == (str(parent.pk), f"sample.wait#{parent.number}")
    assert api.get(f"/api/v1/runs/{parent.pk}/").json()["parent"] is None
    listed = api.get(f"/api/v1/runs/?parent={parent.pk}").json()["results"]
    assert sorted(r["id"] for r in listed) == sorted(str(c.pk) for c in children)
    refused = api.get("/api/v1/runs/?parent=12")
    assert refused.status_code == 400
    assert list(refused.json()["fields"]) == ["parent"]  # the field named
    assert "UUID" in refused.json()["fields"]["parent"][0]


def test_the_api_lists_a_runs_status_history(api: APIClient, user: Any) -> None:
    run = services.run_start(pipeline_name="sample.wait", inputs={}, actor=user)
    services.run_cancel(run=run, actor=user)
    response = api.get(f"/api/v1/runs/{run.pk}/events/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert [(e["from_status"], e["to_status"], e["reason"], e["actor"]) for e in body["results"]] == [
        ("", "queued", "Started", "alice"),
        ("queued", "cancelled", "Cancelled", "alice"),
    ]
    assert api.get(f"/api/v1/runs/{uuid.uuid4()}/events/").status_code == 404
