"""The records REST API: validation, selectors, pagination, tree, events, transfer, TTL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from apps.records import services
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from tests import factories

pytestmark = pytest.mark.django_db


def apply(api: APIClient, **body: Any) -> Any:
    return api.post("/api/v1/records/", body, format="json")


def test_authentication_is_required() -> None:
    response = APIClient().get("/api/v1/records/")
    assert response.status_code == 401
    assert response.json()["error"] == "not_authenticated"


def test_apply_declares_pending_and_is_idempotent(api: APIClient) -> None:
    stand = factories.stand()
    first = apply(api, kind="test.sleep", name="db", owner=str(stand.pk), spec={"create_ms": 5}, labels={"tier": "db"})
    assert first.status_code == 201, first.content
    body = first.json()
    assert (body["phase"], body["owner"], body["labels"]) == (Phase.PENDING, str(stand.pk), {"tier": "db"})
    assert body["owner_chain"] == [{"id": str(stand.pk), "kind": "graphene.stand", "name": "stand"}]
    again = apply(api, kind="test.sleep", name="db", owner=str(stand.pk), spec={"create_ms": 5}, labels={"tier": "db"})
    assert again.status_code == 200
    assert again.json()["id"] == body["id"]
    declared = Event.objects.get(record_id=body["id"], type=EventType.DECLARED)
    assert declared.actor is not None
    assert declared.actor.get_username() == "alice"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "test.sleep", "name": "x", "spec": {"create_ms": "slow"}}, "spec.create_ms"),
        ({"kind": "test.sleep", "name": "x", "spec": {"bogus": 1}}, "spec"),
        ({"kind": "file", "name": "x", "spec": {"content": "no path"}}, "spec"),
        ({"kind": "no.such.kind", "name": "x"}, "kind"),
        ({"kind": "test.sleep", "name": "x", "labels": {"a": 1}}, "labels"),
        ({"kind": "test.sleep", "name": "x", "ttl_seconds": 0}, "ttl_seconds"),
        ({"kind": "test.sleep", "name": ""}, "name"),
    ],
)
def test_bad_input_is_refused_with_field_errors_and_creates_nothing(api: APIClient, body: Any, field: str) -> None:
    stand = factories.stand()
    before = Record.objects.count()
    response = apply(api, owner=str(stand.pk), **body)
    assert response.status_code == 400, response.content
    payload = response.json()
    assert field in payload["fields"], payload
    assert payload["detail"]
    assert Record.objects.count() == before


def test_owner_is_required_single_and_existing(api: APIClient) -> None:
    a, b = factories.stand("a"), factories.stand("b")
    missing = apply(api, kind="test.sleep", name="x")
    assert missing.status_code == 400
    assert "owner" in missing.json()["fields"]
    two = apply(api, kind="test.sleep", name="x", owner=[str(a.pk), str(b.pk)])
    assert two.status_code == 400
    assert "exactly one owner" in two.json()["fields"]["owner"][0]
    unknown = apply(api, kind="test.sleep", name="x", owner="00000000-0000-4000-8000-000000000000")
    assert unknown.status_code == 404
    assert Record.objects.exclude(kind="graphene.stand").count() == 0


def test_roots_only_stands_without_owner(api: APIClient) -> None:
    stand = factories.stand()
    created = apply(api, kind="graphene.stand", name="env")
    assert created.status_code == 201
    assert created.json()["owner"] is None
    assert apply(api, kind="graphene.stand", name="env").status_code == 409
    assert apply(api, kind="graphene.run", name="r").status_code == 400
    assert apply(api, kind="graphene.stand", name="s2", owner=str(stand.pk)).status_code == 400


def test_list_selectors_and_cursor_pagination(api: APIClient) -> None:
    stand = factories.stand()
    other = factories.stand("other")
    for i in range(5):
        services.record_declare(kind="test.sleep", name=f"web-{i}", owner=stand, labels={"tier": "web", "n": str(i)})
    services.record_declare(kind="test.sleep", name="db", owner=other, labels={"tier": "db"})
    services.record_declare(kind="file", name="web-conf", owner=other, spec={"path": "a", "content": "b"})

    def names(**params: Any) -> set[str]:
        response = api.get("/api/v1/records/", params)
        assert response.status_code == 200, response.content
        return {r["name"] for r in response.json()["results"]}

    assert names(kind="file") == {"web-conf"}
    assert names(label="tier=web") == {f"web-{i}" for i in range(5)}
    assert names(label=["tier=web", "n=3"]) == {"web-3"}
    assert names(owner=str(other.pk)) == {"db", "web-conf"}
    assert names(name_prefix="web-", kind="test.sleep") == {f"web-{i}" for i in range(5)}
    assert names(phase="pending", owner=str(other.pk)) == {"db", "web-conf"}
    assert names(phase="ready", kind="test.sleep") == set()

    seen: list[str] = []
    url = "/api/v1/records/?limit=3"
    pages = 0
    while url:
        page = api.get(url).json()
        seen += [r["id"] for r in page["results"]]
        url = page["next"]
        pages += 1
    assert pages == 3
    assert len(seen) == len(set(seen)) == Record.objects.count() == 9


def test_list_query_budget_does_not_grow_with_rows(api: APIClient) -> None:
    stand = factories.stand()
    for i in range(30):
        services.record_declare(kind="test.sleep", name=f"r{i}", owner=stand)
    # A token's first request in a minute also records its use (apps/accounts): the budget is
    # what a list costs a client that keeps using its token.
    assert api.get("/api/v1/whoami/").status_code == 200
    with CaptureQueriesContext(connection) as queries:
        assert api.get("/api/v1/records/?limit=100").status_code == 200
    assert len(queries) <= 3, [q["sql"] for q in queries]


@pytest.mark.parametrize(
    "query",
    ["phase=exploded", "created_after=yesterday", "label=novalue", "owner=not-a-uuid"],
)
def test_bad_selectors_are_explained(api: APIClient, query: str) -> None:
    response = api.get(f"/api/v1/records/?{query}")
    assert response.status_code in (400, 404), response.content
    assert response.json()["detail"]


def test_detail_tree_and_events(api: APIClient) -> None:
    run = factories.run()
    a = factories.sleep(run, "a")
    b = factories.sleep(a, "b")
    c = factories.sleep(b, "c")
    factories.sleep(c, "d")

    detail = api.get(f"/api/v1/records/{c.pk}/").json()
    assert [o["name"] for o in detail["owner_chain"]] == ["run", "a", "b"]
    assert detail["children"] == {"total": 1, "pending": 1}

    tree = api.get(f"/api/v1/records/{run.pk}/tree/?depth=2").json()
    assert tree["name"] == "run"
    assert tree["children"][0]["name"] == "a"
    assert tree["children"][0]["children"][0]["name"] == "b"
    assert tree["children"][0]["children"][0]["children"] == []
    assert tree["children"][0]["children"][0]["truncated"] is True
    assert api.get(f"/api/v1/records/{run.pk}/tree/?depth=99").status_code == 400

    # A record whose bounds hold only free numbers (its one child given away) owns nothing.
    emptied = factories.sleep(run, "emptied")
    given = factories.sleep(emptied, "given")
    services.record_transfer(record=given, new_owner=factories.stand("keep"), given_by=emptied)
    fresh = Record.objects.get(pk=emptied.pk)
    assert fresh.rght - fresh.lft > 1, "free numbers are left in its bounds"
    edge = {n["name"]: n for n in api.get(f"/api/v1/records/{run.pk}/tree/?depth=1").json()["children"]}
    assert edge["emptied"]["truncated"] is False
    assert edge["a"]["truncated"] is True
    assert fresh.is_leaf_node()

    for _ in range(3):
        services.record_extend(record=Record.objects.get(pk=a.pk), by=timedelta(hours=1))
    first = api.get(f"/api/v1/records/{a.pk}/events/?limit=2").json()
    assert [e["type"] for e in first["results"]] == [EventType.DECLARED, EventType.TTL_CHANGED]
    second = api.get(first["next"]).json()
    assert [e["type"] for e in second["results"]] == [EventType.TTL_CHANGED, EventType.TTL_CHANGED]

    assert api.get("/api/v1/records/00000000-0000-4000-8000-000000000000/").status_code == 404
    malformed = api.get("/api/v1/records/nope/")  # no record could have it: a 400 naming it
    assert malformed.status_code == 400
    assert malformed.json()["fields"] == {"id": ["not a record id (a UUID)"]}


def test_transfer_extend_release_over_the_api(api: APIClient) -> None:
    run = factories.run()
    keep = factories.stand("keep")
    a = factories.sleep(run, "a")
    b = factories.sleep(a, "b")

    cycle = api.post(f"/api/v1/records/{a.pk}/transfer/", {"to": str(b.pk)}, format="json")
    assert cycle.status_code == 400
    assert "ancestor" in cycle.json()["detail"]
    taken = api.post(f"/api/v1/records/{b.pk}/transfer/", {"to": str(keep.pk), "from": str(run.pk)}, format="json")
    assert taken.status_code == 409
    assert "given by the current owner" in taken.json()["detail"]

    moved = api.post(
        f"/api/v1/records/{a.pk}/transfer/",
        {"to": str(keep.pk), "from": str(run.pk), "ttl_seconds": 3600},
        format="json",
    )
    assert moved.status_code == 200, moved.content
    body = moved.json()
    assert body["owner"] == str(keep.pk)
    assert body["expires_at"] is not None
    assert [o["name"] for o in api.get(f"/api/v1/records/{b.pk}/").json()["owner_chain"]] == ["keep", "a"]

    extended = api.post(f"/api/v1/records/{a.pk}/extend/", {"by_seconds": 600}, format="json").json()
    assert extended["expires_at"] > body["expires_at"]
    assert api.post(f"/api/v1/records/{a.pk}/extend/", {"by_seconds": -5}, format="json").status_code == 400
    assert api.post(f"/api/v1/records/{a.pk}/release/").json()["expires_at"] is None


def test_delete_without_wait_is_accepted_and_marks_the_subtree(api: APIClient) -> None:
    stand = factories.stand()
    a = factories.sleep(stand, "a")
    factories.sleep(a, "b")
    response = api.delete(f"/api/v1/records/{a.pk}/")
    assert response.status_code == 202
    assert response.json()["deletion_requested_at"] is not None
    assert Record.objects.filter(deletion_requested_at__isnull=False).count() == 2
    event = Event.objects.get(record=a, type=EventType.DELETION_REQUESTED)
    assert event.data["subtree_records"] == 2
    assert event.actor is not None


def test_kind_dictionary(api: APIClient) -> None:
    kinds = {k["name"]: k for k in api.get("/api/v1/kinds/").json()}
    assert {"file", "test.sleep", "test.flaky", "graphene.run", "graphene.stand"} <= set(kinds)
    assert kinds["file"]["spec_schema"]["required"] == ["path", "content"]
    assert api.get("/api/v1/kinds/test.sleep/").json()["name"] == "test.sleep"
    assert api.get("/api/v1/kinds/nope/").status_code == 404


def test_orphans_listing_and_sweep(api: APIClient, admin_api: APIClient) -> None:
    """The sweeper works across namespaces: a developer of one may not run it, an admin of all may."""
    assert api.post("/api/v1/orphans/sweep/?dry_run=true").status_code == 403
    api = admin_api
    swept = api.post("/api/v1/orphans/sweep/?dry_run=true")
    assert swept.status_code == 200
    assert swept.json()["dry_run"] is True
    listing = api.get("/api/v1/orphans/")
    assert listing.status_code == 200
    assert listing.json()["results"] == []


def test_openapi_schema_lists_the_record_endpoints(api: APIClient) -> None:
    response = api.get("/api/schema/?format=json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in ("/api/v1/records/", "/api/v1/records/{id}/tree/", "/api/v1/records/{id}/transfer/", "/api/v1/kinds/"):
        assert path in paths


def test_logs_of_a_record_include_its_subtree_and_filter(api: APIClient) -> None:
    from apps.observability.services import log_write

    run = factories.run()
    child = factories.sleep(run, "child")
    log_write(record_id=run.pk, message="run started")
    log_write(record_id=child.pk, message="child is warming up", severity="debug")
    log_write(record_id=child.pk, message="child failed to bind", severity="error")
    everything = api.get(f"/api/v1/records/{run.pk}/logs/").json()["results"]
    assert [line["message"] for line in everything] == ["run started", "child is warming up", "child failed to bind"]
    assert everything[1]["record_name"] == "child"
    from apps.observability.models import LogLine
    from apps.records.api.serializers import LogLineOutput

    assert everything == LogLineOutput(LogLine.objects.order_by("id"), many=True).data, "the documented shape"
    only_own = api.get(f"/api/v1/records/{run.pk}/logs/?descendants=false").json()["results"]
    assert [line["message"] for line in only_own] == ["run started"]
    errors = api.get(f"/api/v1/records/{run.pk}/logs/?severity=warning").json()["results"]
    assert [line["message"] for line in errors] == ["child failed to bind"]
    grep = api.get(f"/api/v1/records/{run.pk}/logs/?grep=WARMING").json()["results"]
    assert [line["message"] for line in grep] == ["child is warming up"]
    assert api.get(f"/api/v1/records/{run.pk}/logs/?severity=loud").status_code == 400


def test_logs_tail_returns_the_last_lines_and_a_cursor_that_follows_them(api: APIClient) -> None:
    from apps.observability.services import log_write

    run = factories.run()
    for n in range(12):
        log_write(record_id=run.pk, message=f"line {n}")
    body = api.get(f"/api/v1/records/{run.pk}/logs/?tail=3").json()
    assert [line["message"] for line in body["results"]] == ["line 9", "line 10", "line 11"]
    assert api.get(body["next"]).json()["results"] == [], "nothing after the tail yet"
    log_write(record_id=run.pk, message="line 12")
    assert [line["message"] for line in api.get(body["next"]).json()["results"]] == ["line 12"]
    filtered = api.get(f"/api/v1/records/{run.pk}/logs/?tail=2&grep=line 1").json()["results"]
    assert [line["message"] for line in filtered] == ["line 11", "line 12"]
    empty = factories.run("quiet")
    body = api.get(f"/api/v1/records/{empty.pk}/logs/?tail=5").json()
    assert body["results"] == []
    log_write(record_id=empty.pk, message="first")
    assert [line["message"] for line in api.get(body["next"]).json()["results"]] == ["first"]
    for bad in ("0", "x", "10001"):
        response = api.get(f"/api/v1/records/{run.pk}/logs/?tail={bad}")
        assert response.status_code == 400, bad
        assert "tail" in response.json()["fields"]


def test_whoami(api: APIClient) -> None:
    body = api.get("/api/v1/whoami/").json()
    assert body["username"] == "alice"
    assert body["server_version"]
