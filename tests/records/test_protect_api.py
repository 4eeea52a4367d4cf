"""Protect and unprotect over REST: ``POST /api/v1/records/{id}/protect/`` and ``/unprotect/``
take ``update`` on records in the record's namespace; the record's output says who protected
it and when, and what a requested deletion waits on. Bad input: an unknown id (404), a record
deleted or being deleted (409), a root (400) — each changing nothing."""

from __future__ import annotations

from typing import Any

import pytest
from graphene_sdk import RecordInfo
from rest_framework.test import APIClient

from apps.core.models import AuditEntry
from apps.records import services
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from tests import factories

pytestmark = pytest.mark.django_db


def protect(client: APIClient, record: Record | str) -> Any:
    return client.post(f"/api/v1/records/{getattr(record, 'pk', record)}/protect/")


def unprotect(client: APIClient, record: Record | str) -> Any:
    return client.post(f"/api/v1/records/{getattr(record, 'pk', record)}/unprotect/")


def test_protect_and_unprotect_say_who_and_when_with_events_and_audit_rows(api: APIClient) -> None:
    owner = factories.stand()
    db = factories.sleep(owner, "db")
    response = protect(api, db)
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["protected"], body["protected_by"]) == (True, "user:alice")
    assert body["protected_at"] is not None
    assert body["deletion_blocked_by"] == []
    info = RecordInfo.from_api(body)  # the Python client's view of it
    assert (info.protected, info.protected_by) == (True, "user:alice")
    listed = api.get(f"/api/v1/records/?owner={owner.pk}").json()["results"]
    assert [(r["name"], r["protected"], r["protected_by"]) for r in listed] == [("db", True, "user:alice")]
    assert protect(api, db).json()["protected_at"] == body["protected_at"]  # again: nothing changes
    tree = api.get(f"/api/v1/records/{owner.pk}/tree/").json()
    assert (tree["protected"], tree["children"][0]["protected"]) == (False, True)

    gone = unprotect(api, db)
    assert gone.status_code == 200, gone.content
    assert (gone.json()["protected"], gone.json()["protected_by"], gone.json()["protected_at"]) == (False, "", None)

    events = api.get(f"/api/v1/records/{db.pk}/events/").json()["results"]
    told = [(e["type"], e["reason"], e["actor"]) for e in events if e["type"] in ("protected", "unprotected")]
    assert told == [("protected", "Protected", "alice"), ("unprotected", "Unprotected", "alice")]
    rows = AuditEntry.objects.filter(object_id=str(db.pk)).order_by("id")
    assert [(r.action, r.actor_kind, r.actor_name) for r in rows if r.action.endswith("protect")] == [
        ("record.protect", "user", "alice"),
        ("record.unprotect", "user", "alice"),
    ]
    assert rows.get(action="record.protect").before_digest != rows.get(action="record.protect").after_digest


def test_a_deletion_request_answers_what_it_waits_on(api: APIClient, django_capture_on_commit_callbacks: Any) -> None:
    owner = factories.stand()
    env = factories.sleep(owner, "env")
    db = factories.sleep(env, "db")
    assert protect(api, db).status_code == 200
    with django_capture_on_commit_callbacks(execute=False):
        deleting = api.delete(f"/api/v1/records/{env.pk}/?wait=true&timeout=300")  # answers at once
    assert deleting.status_code == 202
    assert deleting.json()["deletion_blocked_by"] == [{"id": str(db.pk), "kind": "test.sleep", "name": "db"}]
    assert api.get(f"/api/v1/records/{db.pk}/").json()["deletion_blocked_by"][0]["id"] == str(db.pk)
    blocked = Event.objects.get(record=env, type=EventType.DELETION_BLOCKED)
    assert blocked.data["protected"] == str(db.pk)
    assert blocked.data["protected_by"] == "user:alice"
    assert protect(api, db).status_code == 200  # protected already: nothing to change
    # Being deleted, the protected record can still be unprotected (and only then goes).
    refused = protect(api, env)
    assert refused.status_code == 409
    assert "is being deleted" in refused.json()["detail"]
    with django_capture_on_commit_callbacks(execute=False):
        assert unprotect(api, db).json()["deletion_blocked_by"] == []


def test_a_viewer_gets_403_and_another_namespace_404(
    api: APIClient, viewer_api: APIClient, django_user_model: Any
) -> None:
    mine = factories.sleep(factories.stand(), "db")
    factories.bind_namespace("team-b")
    theirs = factories.sleep(services.record_create_root(kind="graphene.stand", name="b", namespace="team-b"), "db")
    for call in (protect, unprotect):
        denied = call(viewer_api, mine)
        assert denied.status_code == 403, denied.content
        assert call(api, theirs).status_code == 404
    # Read in team-b but not write: the record is seen, the change refused.
    reader = django_user_model.objects.create_user(username="rita", password="pw")
    factories.bind(reader, "developer")
    factories.bind(reader, "viewer", "team-b")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {factories.api_token(reader)}")
    assert protect(client, theirs).status_code == 403
    assert not Record.objects.filter(protected=True).exists()
    assert not Event.objects.filter(type__in=[EventType.PROTECTED, EventType.UNPROTECTED]).exists()


def test_bad_input_is_refused_and_changes_nothing(api: APIClient, django_capture_on_commit_callbacks: Any) -> None:
    owner = factories.stand()
    gone = factories.sleep(owner, "gone")
    with django_capture_on_commit_callbacks(execute=False):
        services.record_delete_request(record=gone)
    for phase in (Phase.DELETING, Phase.DELETED):
        services.record_transition([Record.objects.get(pk=gone.pk)], phase, reason="Test")

    unknown = protect(api, "00000000-0000-4000-8000-000000000000")
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "not_found"
    assert protect(api, "not-an-id").status_code == 400
    deleted = protect(api, gone)
    assert deleted.status_code == 409
    assert deleted.json()["error"] == "conflict"
    assert "is deleted; only a live record can be protected" in deleted.json()["detail"]
    assert unprotect(api, gone).status_code == 409
    root = protect(api, owner)
    assert root.status_code == 400
    assert "protect the records it owns" in root.json()["detail"]
    assert not Record.objects.filter(protected=True).exists()
    assert not AuditEntry.objects.filter(action__in=["record.protect", "record.unprotect"]).exists()
