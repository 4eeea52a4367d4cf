"""Reading stands over REST: through the records' visibility, and never writing. A pipeline
whose stand has held nothing yet answers with no stand, and reading it makes none."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from apps.pipelines import selectors, services
from apps.records import services as records
from apps.records.models import Record
from tests import factories

pytestmark = pytest.mark.django_db

PIPELINE = "sample.handoff"


@pytest.fixture(autouse=True)
def loaded() -> None:
    services.pipelines_sync_all()


# The token's last use, written at most once a minute by the authentication (apps/accounts): a
# write of the request, not of the stand it reads.
TOKEN_USE = 'UPDATE "accounts_accesstoken" SET "last_used_at"'


def writes(queries: CaptureQueriesContext) -> list[str]:
    return [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].lstrip().split(" ", 1)[0].upper() in {"INSERT", "UPDATE", "DELETE", "COPY"}
        and not q["sql"].startswith(TOKEN_USE)
    ]


def stands() -> int:
    return Record.objects.filter(kind="graphene.stand").count()


def test_reading_a_stand_that_does_not_exist_yet_makes_none(api: APIClient) -> None:
    with CaptureQueriesContext(connection) as queries:
        detail = api.get(f"/api/v1/stands/{PIPELINE}/")
        listing = api.get("/api/v1/stands/")
    assert detail.status_code == 200
    assert detail.json() == {"pipeline": PIPELINE, "namespace": "default", "id": None, "holdings": []}
    assert listing.json() == []
    assert writes(queries) == []
    assert stands() == 0
    assert api.get("/api/v1/stands/no.such.pipeline/").status_code == 404


def test_a_holding_of_a_stand_that_does_not_exist_is_refused_and_makes_none(api: APIClient) -> None:
    elsewhere = factories.sleep(factories.run(), "elsewhere")
    for action, body in (("extend", {"by_seconds": 60}), ("release", {})):
        refused = api.post(f"/api/v1/stands/{PIPELINE}/{action}/", {"record": str(elsewhere.pk), **body}, format="json")
        assert refused.status_code == 400, refused.content
        assert refused.json()["fields"] == {"record": ["not a holding of this stand"]}
    assert stands() == 0


def test_a_stand_shows_what_it_holds(api: APIClient, eager: None, django_capture_on_commit_callbacks: Any) -> None:
    run = factories.run()
    with django_capture_on_commit_callbacks(execute=True):
        db = factories.sleep(run, "db")
        factories.sleep(db, "data")
        cache = factories.sleep(run, "cache")
    stand = services.stand_get(PIPELINE)
    records.record_transfer(record=db, new_owner=stand)
    records.record_transfer(record=cache, new_owner=stand)

    with CaptureQueriesContext(connection) as queries:
        detail = api.get(f"/api/v1/stands/{PIPELINE}/").json()
        listing = api.get("/api/v1/stands/").json()
    assert writes(queries) == []
    assert detail["id"] == str(stand.pk)
    assert [(h["name"], h["subtree_records"]) for h in detail["holdings"]] == [("db", 2), ("cache", 1)]
    assert listing == [{"pipeline": PIPELINE, "namespace": "default", "id": str(stand.pk), "holdings": 2, "records": 3}]


def test_each_stand_says_its_namespace_and_the_list_narrows_to_one(api: APIClient, admin_api: APIClient) -> None:
    team = services.stand_get("sample.team-b", namespace="team-b")
    mine = services.stand_get(PIPELINE)
    # A stand root made by hand with the name of team-b's pipeline, in default: not its stand.
    stray = records.record_create_root(kind="graphene.stand", name="sample.team-b", namespace="default")

    listing = admin_api.get("/api/v1/stands/").json()
    assert [(s["pipeline"], s["namespace"], s["id"]) for s in listing] == [
        (PIPELINE, "default", str(mine.pk)),
        ("sample.team-b", "default", str(stray.pk)),
        ("sample.team-b", "team-b", str(team.pk)),
    ]
    assert [s["id"] for s in admin_api.get("/api/v1/stands/?namespace=team-b").json()] == [str(team.pk)]
    assert [s["id"] for s in admin_api.get("/api/v1/stands/?namespace=default").json()] == [str(mine.pk), str(stray.pk)]
    assert admin_api.get("/api/v1/stands/?namespace=elsewhere").json() == []
    # The detail is the pipeline's stand, in its namespace, where its runs hand over.
    detail = admin_api.get("/api/v1/stands/sample.team-b/").json()
    assert (detail["namespace"], detail["id"]) == ("team-b", str(team.pk))
    assert admin_api.get(f"/api/v1/stands/{PIPELINE}/").json()["namespace"] == "default"

    # A developer of default: its stands (not team-b's pipeline's), and a refusal for team-b.
    assert [(s["pipeline"], s["namespace"]) for s in api.get("/api/v1/stands/").json()] == [(PIPELINE, "default")]
    refused = api.get("/api/v1/stands/?namespace=team-b")
    assert refused.status_code == 403
    assert "may not list stands in namespace 'team-b'" in refused.json()["detail"]


def test_stands_are_read_through_the_records_visibility(api: APIClient) -> None:
    services.stand_get(PIPELINE)
    anonymous = APIClient()
    assert anonymous.get(f"/api/v1/stands/{PIPELINE}/").status_code == 401
    assert anonymous.get("/api/v1/stands/").status_code == 401
    assert selectors.stand_list(user=AnonymousUser()) == []
    assert selectors.stand_find(user=AnonymousUser(), pipeline=PIPELINE) is None
