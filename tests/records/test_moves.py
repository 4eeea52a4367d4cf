"""A re-declaration that changes where an object lives (its kind's ``placement``) moves it:
the object at the old place is removed before the new one is made, and a record deleted
mid-move removes both. Files on the server's disk; tasks run eagerly."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from apps.records import services
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from kinds.file import resolve
from tests import factories

pytestmark = pytest.mark.django_db


def declare(capture: Any, owner: Record, path: str, *, execute: bool = True) -> Record:
    with capture(execute=execute):
        record = services.record_declare(kind="file", name="conf", owner=owner, spec={"path": path, "content": "a\n"})
    record.refresh_from_db()
    return record


def test_a_file_whose_path_changes_is_removed_from_the_old_path(
    eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    owner = factories.stand("moves")
    first, second = f"moves/{uuid.uuid4()}.conf", f"moves/{uuid.uuid4()}.conf"
    record = declare(django_capture_on_commit_callbacks, owner, first)
    assert record.phase == Phase.READY, record.last_error
    assert resolve(first).exists()

    moved = declare(django_capture_on_commit_callbacks, owner, second)
    assert (moved.pk, moved.phase, moved.observed_generation) == (record.pk, Phase.READY, 2)
    assert not resolve(first).exists(), "nothing left at the old path"
    assert resolve(second).read_text() == "a\n"
    assert moved.moved_from is None
    changed = Event.objects.filter(record=record, reason="SpecChanged").get()
    assert changed.data["moving_from"] == {"path": first, "agent": None}
    note = Event.objects.get(record=record, type=EventType.NOTE, reason="MovedAway")
    assert note.data == {"from": {"path": first, "agent": None}, "to": {"path": second, "agent": None}}


def test_a_change_that_keeps_the_place_is_no_move(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    owner = factories.stand("stays")
    path = f"moves/{uuid.uuid4()}.conf"
    declare(django_capture_on_commit_callbacks, owner, path)
    with django_capture_on_commit_callbacks(execute=True):
        record = services.record_declare(
            kind="file", name="conf", owner=owner, spec={"path": path, "content": "b\n", "mode": 0o600}
        )
    record.refresh_from_db()
    assert (record.phase, record.moved_from) == (Phase.READY, None)
    assert resolve(path).read_text() == "b\n"
    assert not Event.objects.filter(record=record, reason="MovedAway").exists()


def test_moving_back_before_the_move_ran_is_no_move(
    eager: None, django_capture_on_commit_callbacks: Any, api: Any
) -> None:
    owner = factories.stand("back")
    first, second = f"moves/{uuid.uuid4()}.conf", f"moves/{uuid.uuid4()}.conf"
    declare(django_capture_on_commit_callbacks, owner, first)
    pending = declare(django_capture_on_commit_callbacks, owner, second, execute=False)
    assert pending.moved_from is not None
    assert pending.moved_from["spec"]["path"] == first
    shown = api.get(f"/api/v1/records/{pending.pk}/").json()
    assert shown["moved_from"]["spec"]["path"] == first, "the API shows the move under way"
    back = declare(django_capture_on_commit_callbacks, owner, first, execute=False)
    assert back.moved_from is None, "back where it is: nothing to remove"
    services.record_converge(record_id=back.pk)
    back.refresh_from_db()
    assert back.phase == Phase.READY
    assert resolve(first).exists()
    assert not resolve(second).exists()
    assert not Event.objects.filter(record=back, reason="MovedAway").exists()


def test_a_second_move_before_the_first_ran_removes_the_object_where_it_is(
    eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    owner = factories.stand("twice")
    first, second, third = (f"moves/{uuid.uuid4()}.conf" for _ in range(3))
    declare(django_capture_on_commit_callbacks, owner, first)
    declare(django_capture_on_commit_callbacks, owner, second, execute=False)
    record = declare(django_capture_on_commit_callbacks, owner, third, execute=False)
    assert record.moved_from is not None
    assert record.moved_from["spec"]["path"] == first, "the object is still at the first path"
    services.record_converge(record_id=record.pk)
    record.refresh_from_db()
    assert record.phase == Phase.READY
    assert [resolve(p).exists() for p in (first, second, third)] == [False, False, True]


def test_deleting_a_record_mid_move_removes_the_object_at_the_old_place(
    eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    owner = factories.stand("deleted-mid-move")
    first, second = f"moves/{uuid.uuid4()}.conf", f"moves/{uuid.uuid4()}.conf"
    declare(django_capture_on_commit_callbacks, owner, first)
    record = declare(django_capture_on_commit_callbacks, owner, second, execute=False)
    assert record.moved_from is not None
    with django_capture_on_commit_callbacks(execute=True):
        services.record_delete_request(record=record)
    record.refresh_from_db()
    assert record.phase == Phase.DELETED
    assert not resolve(first).exists()
    assert not Path(resolve(second)).exists()


def test_a_record_never_made_has_nothing_to_move(eager: None, django_capture_on_commit_callbacks: Any) -> None:
    owner = factories.stand("fresh")
    record = declare(django_capture_on_commit_callbacks, owner, f"moves/{uuid.uuid4()}.conf", execute=False)
    again = declare(django_capture_on_commit_callbacks, owner, f"moves/{uuid.uuid4()}.conf", execute=False)
    assert again.pk == record.pk
    assert again.moved_from is None
