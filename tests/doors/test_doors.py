"""The doors, one promise at a time: bad input is a 4xx in the API's JSON error shape naming
what was refused, whoever refused it, and nothing is created. (``test_properties.py`` throws
generated hostile values at every write endpoint.)"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import Client
from graphene_sdk import validation as rules
from graphenectl import _inputs
from graphenectl._cmd_run import check_inputs
from graphenectl._errors import UsageError
from pydantic import BaseModel, Field
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from apps.pipelines.models import Run
from apps.records.models import Record
from graphene_project.routing import websocket_urlpatterns
from tests import factories
from tests.conftest import WithUser
from tests.harness.net import opener
from tests.harness.web import WebServer

pytestmark = pytest.mark.django_db

START = "/api/v1/pipelines/sample.tree/runs/"


def refused(response: Any, status: int, *fields: str) -> dict[str, Any]:
    """The response is ``status`` in the API's error shape, naming exactly ``fields``."""
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json", response["Content-Type"]
    body = response.json()
    assert set(body) == {"error", "detail", "fields"}, body
    assert isinstance(body["detail"], str)
    assert body["detail"]
    assert set(body["fields"]) == set(fields), body
    return dict(body)


def post_raw(api: APIClient, path: str, raw: str, content_type: str = "application/json") -> Any:
    return api.generic("POST", path, raw, content_type=content_type)


# --- values PostgreSQL cannot store ------------------------------------------------------------


def test_a_nul_or_a_lone_surrogate_anywhere_in_a_body_is_a_400_naming_its_path(api: APIClient) -> None:
    refused(api.post(START, {"inputs": {"label": "a\x00b"}}, format="json"), 400, "inputs.label")
    stand = factories.stand()
    body = {"kind": "test.sleep", "name": "x", "owner": str(stand.pk), "spec": {"env": {"FOO": "\ud800"}}}
    refused(post_raw(api, "/api/v1/records/", json.dumps(body)), 400, "spec.env.FOO")
    refused(api.post(START, {"inputs": {"ke\x00y": 1}}, format="json"), 400, "inputs.ke\\u0000y")
    refused(post_raw(api, START, '{"inputs": {"branches": 1e400}}'), 400, "inputs.branches")
    assert not Run.objects.exists()
    assert Record.objects.count() == 1  # the stand


def test_a_nul_in_a_query_parameter_or_a_path_is_a_400_naming_it(api: APIClient) -> None:
    refused(api.get("/api/v1/records/?label=a%00b"), 400, "?label")
    refused(api.get("/api/v1/records/?grep%00=x"), 400, "?grep\\u0000")
    refused(api.post("/api/v1/pipelines/sample%00tree/runs/", {}, format="json"), 400, "path")


def test_nesting_deeper_than_the_bound_is_a_400_before_anything_parses_it(api: APIClient, settings: Any) -> None:
    settings.GRAPHENE_API_MAX_JSON_DEPTH = 5
    body = refused(post_raw(api, START, "[" * 100_000 + "]" * 100_000), 400, "(body)")
    assert body["error"] == "too_deep"
    inputs = {"inputs": {"a": [[[[[1]]]]]}}  # six levels in all
    assert refused(api.post(START, inputs, format="json"), 400, "inputs.a.0.0.0")["error"] == "too_deep"
    settings.GRAPHENE_API_MAX_JSON_DEPTH = 64
    refused(api.post(START, inputs, format="json"), 400, "inputs.a")  # now only: an unknown input


def test_a_body_over_the_bound_is_a_413_and_a_form_body_a_415(api: APIClient, settings: Any) -> None:
    settings.GRAPHENE_API_MAX_BODY_BYTES = settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = refused(post_raw(api, START, json.dumps({"inputs": {"pad": "x" * 2000}})), 413)
    assert body["error"] == "too_large"
    assert "GRAPHENE_API_MAX_BODY_BYTES" in body["detail"]
    settings.GRAPHENE_API_MAX_BODY_BYTES = settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    form = post_raw(api, START, "inputs=x", "application/x-www-form-urlencoded")
    assert refused(form, 415)["error"] == "unsupported_media_type"


# --- strict inputs, the same rules on the server and in graphenectl ----------------------------


@pytest.mark.parametrize(
    ("value", "accepted"), [(True, False), ("1", False), (1.0, False), (1.5, False), (None, False), (1, True)]
)
def test_inputs_are_strict_on_the_server_and_in_graphenectl(api: APIClient, value: Any, accepted: bool) -> None:
    """``true`` is not an integer, nor is ``"1"`` (pydantic's lax mode took both; graphenectl
    refused them): now both refuse them, for the same reason, naming the input."""
    definition = api.get("/api/v1/pipelines/sample.tree/").json()
    cli = _inputs.validate(definition["input_schema"], {"branches": value})
    assert (not cli) is accepted, cli
    if accepted:
        check_inputs(definition, {"branches": value}, [])
        return
    with pytest.raises(UsageError) as by_cli:
        check_inputs(definition, {"branches": value}, [])
    assert list(by_cli.value.fields) == ["branches"]
    refused(api.post(START, {"inputs": {"branches": value}}, format="json"), 400, "inputs.branches")
    assert not Run.objects.exists()


class Lenient(BaseModel):
    replicas: int | str = Field(default=1, description="a number, or a name the pipeline resolves")
    count: int = 0


def test_a_string_is_an_integer_only_where_the_schema_says_so() -> None:
    assert rules.validate_inputs(Lenient, {"replicas": "1"}).replicas == "1"
    assert rules.schema_problems(Lenient.model_json_schema(), {"replicas": "1"}) == {}
    assert set(rules.schema_problems(Lenient.model_json_schema(), {"count": "1"})) == {"count"}


def test_an_undeclared_input_is_refused_by_both(api: APIClient) -> None:
    refused(api.post(START, {"inputs": {"brnaches": 3}}, format="json"), 400, "inputs.brnaches")
    refused(api.post(START, {"inptus": {"branches": 3}}, format="json"), 400, "inptus")
    definition = api.get("/api/v1/pipelines/sample.tree/").json()
    with pytest.raises(UsageError) as by_cli:
        check_inputs(definition, {}, ["brnaches=3"])
    assert list(by_cli.value.fields) == ["brnaches"]


def test_graphenectl_refuses_what_postgresql_cannot_store_before_sending(api: APIClient) -> None:
    definition = api.get("/api/v1/pipelines/hello/").json()
    # An argument that is not UTF-8 reaches Python as lone surrogates (surrogateescape).
    for base, pairs in [({}, ["name=\udcffAda"]), ({"name": "A\x00da"}, []), ({"pause_seconds": float("inf")}, [])]:
        with pytest.raises(UsageError) as by_cli:
            check_inputs(definition, base, pairs)
        assert list(by_cli.value.fields) in (["name"], ["pause_seconds"])


# --- ids, limits, lists -------------------------------------------------------------------------


def test_malformed_ids_are_a_400_naming_the_field_not_a_404(api: APIClient) -> None:
    refused(api.get("/api/v1/records/not-an-id/"), 400, "id")
    refused(api.get("/api/v1/runs/12/events/"), 400, "id")
    refused(api.get("/api/v1/records/?owner=12"), 400, "owner")
    refused(
        api.post("/api/v1/records/", {"kind": "test.sleep", "name": "x", "owner": "12"}, format="json"), 400, "owner"
    )
    refused(api.post("/api/v1/artifacts/?name=a&owner=12", b"x", content_type="application/octet-stream"), 400, "owner")
    missing = api.get(f"/api/v1/records/{uuid.uuid4()}/")  # well formed, but no such record
    assert missing.status_code == 404


def test_limit_and_cursor_are_checked(api: APIClient) -> None:
    refused(api.get("/api/v1/runs/?limit=abc"), 400, "limit")
    refused(api.get("/api/v1/records/?limit=0"), 400, "limit")
    refused(api.get("/api/v1/records/?limit=--5"), 400, "limit")
    refused(api.get(f"/api/v1/records/{factories.stand().pk}/tree/?depth=" + "9" * 5000), 400, "depth")
    refused(api.get("/api/v1/runs/?cursor=abc"), 400, "cursor")
    refused(api.get("/api/v1/records/?cursor=cD05OTk5"), 400, "cursor")  # p=9999: not a date-time
    assert api.get("/api/v1/runs/?limit=5000").status_code == 200  # more than the most: the most


def test_pipelines_are_paged_like_every_list(api: APIClient) -> None:
    first = api.get("/api/v1/pipelines/?limit=2").json()
    assert set(first) == {"next", "previous", "results"}
    names = [p["name"] for p in first["results"]]
    assert names == sorted(names)
    assert len(names) == 2
    rest = api.get(first["next"]).json()["results"]
    assert names[-1] < rest[0]["name"]


# --- every error under /api/ in one shape -------------------------------------------------------


def test_unknown_paths_wrong_methods_and_csrf_failures_answer_in_the_json_shape(
    api: APIClient, django_user_model: Any
) -> None:
    assert refused(api.get("/api/v1/nosuch/"), 404)["error"] == "not_found"
    assert refused(api.post("/api/v1/nosuch/", {}, format="json"), 404)["error"] == "not_found"
    assert "did you mean /api/v1/runs/" in refused(api.post("/api/v1/runs", {}, format="json"), 404)["detail"]
    assert api.get("/api/v1/runs").status_code == 301  # a GET is redirected to the endpoint
    assert refused(api.delete("/api/v1/pipelines/"), 405)["error"] == "method_not_allowed"
    session = Client(enforce_csrf_checks=True)
    session.force_login(django_user_model.objects.create_user(username="browser", password="pw"))
    refused(session.post("/api/v1/records/", {}, content_type="application/json"), 403)
    assert session.get("/nosuch/")["Content-Type"].startswith("text/html")  # the Studio keeps its own


def _raw(web: WebServer, method: str, path: str, *, token: str, body: bytes = b"", ctype: str = "") -> Any:
    headers = {"Authorization": f"Token {token}", **({"Content-Type": ctype} if ctype else {})}
    request = urllib.request.Request(f"{web.url}{path}", data=body or None, method=method, headers=headers)  # noqa: S310
    try:
        with opener.open(request, timeout=60) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


@pytest.mark.django_db(transaction=True)
def test_the_real_server_answers_every_kind_of_error_in_the_json_shape(web: WebServer, user: Any) -> None:
    """Through daphne, the middleware and Django: a 50 MB body is a JSON 413 (not Django's
    HTML 400), ``%00`` in a path a JSON 400 (not an HTML CSRF 403), an unknown path a JSON 404
    (not a redirect to the Studio's login), deep JSON a 400 (not a RecursionError's 500)."""
    token = Token.objects.create(user=user).key
    cases = [
        ("POST", START, b"{" + b" " * (50 * 1024 * 1024) + b"}", "application/json", 413),
        ("POST", "/api/v1/pipelines/sample%00tree/runs/", b"{}", "application/json", 400),
        ("GET", "/api/v1/nosuch/", b"", "", 404),
        ("POST", "/api/v1/nosuch/", b"{}", "application/json", 404),
        ("POST", START, b"[" * 10_000 + b"]" * 10_000, "application/json", 400),
        ("POST", START, b'{"inputs": {"label": "\\u0000"}}', "application/json", 400),
        ("GET", "/api/v1/records/?label=a%00b", b"", "", 400),
        ("PATCH", "/api/v1/runs/", b"{}", "application/json", 405),
        ("POST", START, b"<xml/>", "application/xml", 415),
    ]
    for method, path, body, ctype, status in cases:
        got, content_type, raw = _raw(web, method, path, token=token, body=body, ctype=ctype)
        assert (got, content_type) == (status, "application/json"), (method, path, got, raw[:300])
        assert set(json.loads(raw)) == {"error", "detail", "fields"}, raw
    assert not Run.objects.exists()


# --- websockets and the Studio ------------------------------------------------------------------


def test_a_websocket_refuses_a_nul_in_its_query_as_rest_does(user: Any) -> None:
    run = factories.run()

    async def attempt(path: str) -> tuple[Any, Any]:
        communicator = WebsocketCommunicator(WithUser(URLRouter(websocket_urlpatterns), user), path)
        assert (await communicator.connect())[0]
        message = await communicator.receive_json_from(timeout=10)
        closed = await communicator.receive_output(timeout=10)
        return message, closed.get("code")

    message, code = async_to_sync(attempt)(f"/ws/records/{run.pk}/logs/?grep=a%00b")
    assert (code, list(message["fields"])) == (4400, ["?grep"])


def test_the_studio_start_form_shows_the_doors_refusal_on_the_field(django_user_model: Any) -> None:
    studio = Client()
    studio.force_login(django_user_model.objects.create_superuser(username="ada", password="pw"))
    page = studio.post("/pipelines/hello/", {"name": "A\x00da", "pause_seconds": "0"})
    assert page.status_code == 200
    assert "NUL character" in page.content.decode()
    assert not Run.objects.exists()
    refused = studio.get("/runs/?q=a%00b")  # the door's check holds for the Studio's pages too
    assert refused.status_code == 400


def test_the_sdk_client_refuses_an_unsendable_body_before_sending_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's rules, on the client's side: nothing reaches the network (port 9 answers nothing)."""
    from graphene_sdk import Client, ClientError

    monkeypatch.delenv("GRAPHENE_CONTEXT", raising=False)
    client = Client("https://127.0.0.1:9", token="unused")
    with pytest.raises(ClientError) as refused:
        client.start_by_name("hello", {"name": "A\x00da", "tags": ["\udcff"]})
    assert (refused.value.status, refused.value.code) == (400, "validation_failed")
    assert set(refused.value.fields) == {"inputs.name", "inputs.tags.0"}
