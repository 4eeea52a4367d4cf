"""The record page's protect and unprotect buttons (Django's test client): shown to those who may
update the record, calling the services the API calls after the same checks; the page says who
protected a record and what a waiting deletion waits on."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from apps.records import services
from apps.records.choices import EventType
from apps.records.models import Event, Record
from tests import factories

pytestmark = pytest.mark.django_db


def page(client: Client, record: Record) -> str:
    return client.get(f"/records/record/{record.pk}/change/").content.decode()


def act(client: Client, record: Record, what: str) -> str:
    return client.post(f"/records/record/{record.pk}/act/", {"do": what}, follow=True).content.decode()


def test_protect_then_unprotect_from_the_record_page(studio: Client, django_capture_on_commit_callbacks: Any) -> None:
    env = factories.sleep(factories.run("sample.protect#1"), "env")
    db = factories.sleep(env, "db")
    before = page(studio, db)
    assert 'id="action-protect"' in before
    assert 'id="record-protected"' not in before

    done = act(studio, db, "protect")
    assert "Protected: a deletion that reaches test.sleep/db stops there" in done
    assert 'id="record-protected"' in done
    assert "protected by user:ada" in done
    assert 'id="action-unprotect"' in done
    assert Record.objects.get(pk=db.pk).protected

    confirm = studio.get(f"/records/record/{env.pk}/delete/").content.decode()
    assert 'id="delete-protected"' in confirm
    assert "The deletion stops at 1 protected record" in confirm
    with django_capture_on_commit_callbacks(execute=False):
        services.record_delete_request(record=env)
    waiting = page(studio, env)
    assert 'id="record-blocked"' in waiting
    assert f'href="/records/record/{db.pk}/change/">test.sleep/db</a>' in waiting
    assert 'id="action-protect"' not in waiting  # being deleted: too late to protect it
    assert 'id="action-unprotect"' in page(studio, db)  # ... but the protected one can go

    with django_capture_on_commit_callbacks(execute=False):
        gone = act(studio, db, "unprotect")
    assert "Unprotected: the deletion that waited on test.sleep/db goes on" in gone
    assert not Record.objects.get(pk=db.pk).protected
    actors = Event.objects.filter(record=db, type__in=[EventType.PROTECTED, EventType.UNPROTECTED])
    assert {e.actor.get_username() for e in actors if e.actor} == {"ada"}


def test_a_viewer_sees_no_button_and_cannot_protect(django_user_model: Any) -> None:
    db = factories.sleep(factories.run("sample.protect#1"), "db")
    vera = django_user_model.objects.create_user(username="vera", password="pw")
    factories.bind(vera, "viewer")
    client = Client()
    client.force_login(vera)
    shown = page(client, db)
    assert 'id="action-protect"' not in shown
    assert 'id="protect-form"' not in shown
    refused = act(client, db, "protect")
    assert "Vera may not update records in namespace" in refused
    assert not Record.objects.get(pk=db.pk).protected


def test_a_root_has_no_button_and_is_refused(studio: Client) -> None:
    root = factories.run("sample.protect#1")
    assert 'id="protect-form"' not in page(studio, root)
    refused = act(studio, root, "protect")
    assert "protect the records it owns" in refused
