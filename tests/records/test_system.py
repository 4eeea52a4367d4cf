"""Records against real Celery worker processes, PostgreSQL and Redis (``-m system``)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from apps.records import services
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from kinds.testing import objects_of
from tests import factories
from tests.conftest import Worker, running_beat, wait_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def phase_of(record: Record) -> str:
    return Record.objects.get(pk=record.pk).phase


def all_in(records: list[Record], phase: str) -> bool:
    return Record.objects.filter(pk__in=[r.pk for r in records]).exclude(phase=phase).count() == 0


def span(record: Record) -> tuple[datetime, datetime]:
    """When the record entered deleting and when it became deleted."""
    events = Event.objects.filter(record=record, type=EventType.PHASE_CHANGED)
    start = events.filter(data__to=Phase.DELETING).order_by("id").first()
    end = events.get(data__to=Phase.DELETED)
    assert start is not None
    return start.created_at, end.created_at


def test_children_are_deleted_before_parents_and_branches_in_parallel(workers: list[Worker]) -> None:
    root = factories.run()
    branches = []
    for b in ("left", "right"):
        branch = factories.sleep(root, b)
        mids = [factories.sleep(branch, f"{b}-{i}") for i in range(2)]
        leaves = [factories.sleep(mid, f"{mid.name}-leaf", delete_ms=800) for mid in mids]
        branches.append((branch, mids, leaves))
    everything = [r for branch, mids, leaves in branches for r in (branch, *mids, *leaves)]
    wait_for(lambda: all_in(everything, Phase.READY), timeout=60, what="the tree to be ready")

    services.record_delete_request(record=root)
    wait_for(lambda: all_in([*everything, root], Phase.DELETED), timeout=60, what="the tree to be deleted")

    for record in [root, *everything]:
        _, parent_done = span(record)
        for child in Record.objects.filter(parent=record):
            _child_start, child_done = span(child)
            assert child_done <= parent_done, f"{child} finished after its owner {record}"
            parent_start, _ = span(record)
            assert child_done <= parent_start, f"{record} began deleting before {child} was gone"
    # Leaves in different branches (different tasks, different workers) overlap in time.
    (_, _, left_leaves), (_, _, right_leaves) = branches
    left = [span(r) for r in left_leaves]
    right = [span(r) for r in right_leaves]
    assert any(a0 < b1 and b0 < a1 for a0, a1 in left for b0, b1 in right), (left, right)
    assert all(objects_of(str(r.pk)) == [] for r in everything)


def test_a_delete_failing_three_times_ends_deleted_with_its_failures(workers: list[Worker]) -> None:
    owner = factories.run()
    record = factories.flaky(owner, "stubborn", delete_failures=3)
    wait_for(lambda: phase_of(record) == Phase.READY, what="ready")
    services.record_delete_request(record=owner)
    wait_for(lambda: phase_of(owner) == Phase.DELETED, timeout=60, what="owner deleted")
    assert phase_of(record) == Phase.DELETED
    errors = list(Event.objects.filter(record=record, type=EventType.ERROR).order_by("id"))
    assert [e.data["attempt"] for e in errors] == [1, 2, 3]
    assert all("injected delete failure" in e.message for e in errors)
    delays = [e.data["retry_in_s"] for e in errors]
    assert delays[0] < delays[1] < delays[2], f"backoff must grow: {delays}"
    for (before, after), delay in zip(itertools.pairwise(errors), delays, strict=False):
        assert (after.created_at - before.created_at).total_seconds() >= delay * 0.95, "retried before its backoff"


def test_a_create_retried_after_a_crash_adopts_the_object(start_worker: Callable[..., Worker]) -> None:
    doomed = start_worker("doomed", concurrency=1)
    owner = factories.run()
    record = factories.sleep(owner, "slow", create_ms=3000)
    wait_for(lambda: objects_of(str(record.pk)), timeout=30, what="the create to have made its object")
    doomed.kill()
    assert phase_of(record) == Phase.CREATING

    start_worker("survivor")
    # The beat task's body: the lease ran out, so the lost convergence is enqueued again.
    wait_for(lambda: services.records_reconcile() or phase_of(record) == Phase.READY, timeout=30, what="reconcile")
    wait_for(lambda: phase_of(record) == Phase.READY, timeout=30, what="the retried create")
    record.refresh_from_db()
    assert record.outputs["adopted"] is True
    assert len(objects_of(str(record.pk))) == 1, "exactly one object: adopted, not created twice"


def test_ttl_expiry_deletes_the_subtree_via_beat(workers: list[Worker], tmp_path: Path) -> None:
    stand = factories.stand()
    held = factories.sleep(stand, "held")
    inner = factories.sleep(held, "inner")
    other = factories.sleep(stand, "other")
    wait_for(lambda: all_in([held, inner, other], Phase.READY), what="ready")
    services.record_set_expiry(record=held, expires_at=timezone.now() + timedelta(seconds=2))
    with running_beat(tmp_path):
        wait_for(lambda: all_in([held, inner], Phase.DELETED), timeout=40, what="the expired subtree to be deleted")
    assert phase_of(other) == Phase.READY
    assert phase_of(stand) == Phase.READY
    assert Event.objects.filter(record=held, type=EventType.EXPIRED).count() == 1


def test_delete_while_create_is_in_flight_leaves_nothing_behind(workers: list[Worker]) -> None:
    owner = factories.run()
    record = factories.sleep(owner, "slow", create_ms=1500)
    wait_for(lambda: objects_of(str(record.pk)), timeout=30, what="the create to be under way")
    services.record_delete_request(record=owner)
    wait_for(lambda: phase_of(owner) == Phase.DELETED, timeout=30, what="owner deleted")
    assert phase_of(record) == Phase.DELETED
    assert objects_of(str(record.pk)) == [], "the delete waited for the create and removed its object"


def test_api_delete_wait_returns_when_the_subtree_is_gone(workers: list[Worker], api: Any) -> None:
    stand = factories.stand()
    a = factories.sleep(stand, "a")
    factories.sleep(a, "b")
    wait_for(lambda: phase_of(a) == Phase.READY, what="ready")
    response = api.delete(f"/api/v1/records/{stand.pk}/?wait=true&timeout=30")
    assert response.status_code == 200, response.content
    assert response.json()["phase"] == Phase.DELETED
    assert Record.objects.filter(tree_id=stand.tree_id).exclude(phase=Phase.DELETED).count() == 0
