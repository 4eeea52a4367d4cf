"""Deleting a namespace: refused while it holds something, counting what is left (what
``graphenectl namespace delete`` prints); a record's tombstone is history, not something left."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.core import rbac
from apps.core.models import Namespace
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Record
from apps.secrets import services as secrets
from tests import factories

pytestmark = pytest.mark.django_db

NAME = "leaving"


def refusal(api: APIClient) -> str:
    response = api.delete(f"/api/v1/namespaces/{NAME}/")
    assert response.status_code == 409, response.content
    return str(response.json()["detail"])


def test_tombstones_do_not_keep_a_namespace_what_is_still_there_does(
    admin_api: APIClient, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    factories.bind_namespace(NAME)
    stand = records.record_create_root(kind="graphene.stand", name="env", namespace=NAME)
    with django_capture_on_commit_callbacks(execute=True):
        box = factories.sleep(stand, "box")
    secrets.secret_create(name="db-password", value="hunter2", namespace=NAME)
    assert refusal(admin_api) == f"namespace {NAME!r} still holds 2 records, 1 secret; delete them first"

    # Deleted: their tombstones stay, and count for nothing.
    with django_capture_on_commit_callbacks(execute=True):
        records.record_delete_request(record=stand)
    assert {r.phase for r in Record.objects.filter(pk__in=[stand.pk, box.pk])} == {Phase.DELETED}
    assert refusal(admin_api) == f"namespace {NAME!r} still holds 1 secret; delete them first"
    secrets.secret_delete(name="db-password", namespace=NAME)

    # A record whose deletion is requested but not carried out yet is still there.
    other = records.record_create_root(kind="graphene.stand", name="other", namespace=NAME)
    with django_capture_on_commit_callbacks() as deletion:
        records.record_delete_request(record=other)
    assert Record.objects.get(pk=other.pk).phase != Phase.DELETED
    assert refusal(admin_api) == f"namespace {NAME!r} still holds 1 record; delete them first"
    with django_capture_on_commit_callbacks(execute=True):
        for task in deletion:
            task()
    assert Record.objects.get(pk=other.pk).phase == Phase.DELETED

    assert admin_api.delete(f"/api/v1/namespaces/{NAME}/").status_code == 204
    assert not Namespace.objects.filter(name=NAME).exists()
    # The tombstones stay, with their namespace, until the purge.
    assert Record.objects.filter(namespace=NAME, phase=Phase.DELETED).count() == 3


def test_the_tombstone_phase_core_names_is_the_records_own() -> None:
    assert rbac.TOMBSTONE_PHASE == Phase.DELETED
