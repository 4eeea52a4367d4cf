"""Every door asks the access module: a walk over every URL and websocket route fails on one
that names no rule, then every REST route is tried as an anonymous caller (401), as a viewer
(no write goes through) and as a developer bound only in the default namespace (nothing of
another namespace is seen or touched, listing counts included); the websockets likewise."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.admin import AdminSite
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from graphene_sdk import _delivery
from rest_framework.test import APIClient

from apps.accounts import services as accounts
from apps.agents import services as agents
from apps.api.permissions import rule_of
from apps.artifacts import services as artifacts
from apps.core import access
from apps.core.models import RoleBinding
from apps.pipelines import services as pipelines
from apps.pipelines.delivery import revisions, sources
from apps.pipelines.models import Pipeline as PipelineRow
from apps.pipelines.models import Trigger as TriggerRow
from apps.pipelines.services import triggers
from apps.records import services as records
from apps.records.models import Record
from apps.secrets import services as secrets
from graphene_project.routing import websocket_urlpatterns
from tests import factories
from tests.conftest import WithUser

pytestmark = pytest.mark.django_db

OTHER = "team-b"

# Routes outside the API that no role governs, each with the reason; a new route must either
# name its rule or be added here, deliberately.
OPEN_ROUTES = {
    "healthz": "liveness for load balancers: says nothing about data",
    "readyz": "readiness for load balancers: says nothing about data",
    "metrics": "Prometheus exposition; its own bearer token (GRAPHENE_METRICS_TOKEN)",
    "agents-download": "the agent's code for machines being installed: public by design",
    "tls-ca": "the CA's certificate, for clients to pin: public by design",
    "webhook": "a trigger's deliveries: each checked against the trigger's own secret (HMAC or bearer)",
    "schema": "the API's description: every signed-in caller (drf-spectacular's own check)",
    "api-docs": "Swagger UI over the schema: every signed-in caller",
}
# The admin site's own views: its login and logout are open; the rest need a Studio member
# (``StudioSite.has_permission``: staff or bound to a role) and show what the selectors allow.
SITE_VIEWS = {
    "login",
    "logout",
    "password_change",
    "password_change_done",
    "i18n_javascript",
    "index",
    "app_index",
    "autocomplete_view",
    "catch_all_view",
}


def _walk(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, Any, str | None]]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), entry.callback, entry.name


def _rule_problem(route: str, callback: Any, name: str | None) -> str | None:
    """Why ``route`` names no access rule, or None when it names one."""
    view_class = getattr(callback, "cls", None)
    if view_class is not None:  # DRF
        if getattr(view_class, "access_public", False) or name in OPEN_ROUTES:
            return None
        narrowed = set(getattr(view_class, "access_narrowed", ()))
        actions = getattr(callback, "actions", None)
        if actions is None:
            actions = {m: m for m in view_class.http_method_names if m != "options" and hasattr(view_class, m)}
        missing = sorted(a for a in actions.values() if rule_of(view_class, a) is None and a not in narrowed)
        return f"{route}: {view_class.__name__} names no rule for {missing}" if missing else None
    if name in OPEN_ROUTES:
        return None
    target = callback
    while not hasattr(target, "__self__") and hasattr(target, "__wrapped__"):
        target = target.__wrapped__  # down the decorators, to the view (a method keeps its owner)
    if getattr(target, "access_rule", None) is not None:
        return None
    owner = getattr(target, "__self__", None)
    if isinstance(owner, AdminSite) and target.__name__ in SITE_VIEWS:
        return None
    if owner is not None and getattr(owner, "access_resource", None):
        return None  # a model page of an AccessAdmin (or the users' and groups' pages)
    if getattr(target, "__name__", "") == "not_found" or name == "view_on_site":
        return None  # the API's JSON 404; the admin's redirect to an object's own page
    if getattr(getattr(target, "view_class", None), "__name__", "") == "RedirectView":
        return None  # the admin's "<id>/" → "<id>/change/" redirect: the change page's rule applies
    if "api(?:/|$)" in route:  # the API's JSON 404
        return None
    return f"{route} ({name}): {getattr(target, '__qualname__', target)!r} names no access rule"


def test_every_http_and_websocket_route_names_its_access_rule() -> None:
    problems = [p for p in (_rule_problem(*r) for r in _walk(get_resolver().url_patterns)) if p]
    for route in websocket_urlpatterns:
        consumer = getattr(route.callback, "consumer_class", None)
        if getattr(consumer, "access_rule", None) is None:
            problems.append(f"ws {route.pattern}: {consumer!r} names no access rule")
    assert not problems, "\n".join(problems)


def test_the_walk_sees_the_routes_it_must() -> None:
    """The walk is not vacuous: it reaches the API, the Studio's pages and the model pages."""
    routes = {route for route, _, _ in _walk(get_resolver().url_patterns)}
    assert any("runs/(?P<pk>" in r for r in routes)
    assert any(r.startswith("runs/<uuid:run_id>") for r in routes)
    assert any("agents/agent/" in r and "terminal" in r for r in routes)
    assert len(websocket_urlpatterns) >= 5


# --- the promises, route by route --------------------------------------------------------------


@dataclass
class Place:
    """One of each thing the routes act on, in one namespace."""

    namespace: str
    stand: Record
    held: Record
    run: Any
    agent: Record
    command: Any
    artifact: Record
    pipeline: str
    secret: str
    account: str  # a service account of the namespace
    account_token: str  # the id of one of its tokens
    revision: str  # the digest of a revision of the namespace
    archive: bytes  # pipeline code not pushed yet (a tar.gz)
    source: str  # a git source of the namespace (its repository is never reached: see the routes)
    trigger: str  # the id of a (daily) cron trigger of the pipeline


def _code(namespace: str, name: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix="routes-code-"))
    (root / "p.py").write_text(
        "from pydantic import BaseModel\nfrom graphene_sdk import pipeline\n\n\nclass In(BaseModel):\n    pass\n\n\n"
        f"@pipeline({name!r}, inputs=In)\ndef p(ctx, inputs):\n    return None\n"
    )
    return root


def _place(namespace: str, pipeline: str) -> Place:
    stand = records.record_create_root(kind="graphene.stand", name=f"stand-{namespace}", namespace=namespace)
    held = records.record_declare(kind="test.sleep", name="held", owner=stand, spec={})
    run = pipelines.run_start(pipeline_name=pipeline, inputs={"steps": 0})
    agent = agents.agent_record_declare(owner=stand, name=f"box-{namespace}")
    command = agents.command_submit(agent=agent, kind="exec", payload={"argv": ["true"]})
    artifact, _ = artifacts.artifact_upload(owner=stand, name=f"a-{namespace}.txt", chunks=[b"bytes"])
    secret = f"s-{namespace}"
    secrets.secret_create(name=secret, value="v", namespace=namespace)
    account = accounts.service_account_create(name=f"sa-{namespace}", namespace=namespace)
    account_token = accounts.service_account_token_issue(account=account).token
    # the stand of the pipeline holds one record, so its stand routes have something to act on
    pipelines.stand_get(pipeline, namespace=namespace)
    revision = revisions.revision_materialize(tree=_code(namespace, f"routes.{namespace}"), namespace=namespace)
    archive = _delivery.pack(_code(namespace, f"routes.new-{namespace}"), max_bytes=10**6)
    # Nothing listens there: a sync that got past the door would fail, not reach the network.
    source = sources.source_apply(
        namespace=namespace, name=f"src-{namespace}", url="git://127.0.0.1:9/app.git", ref="main", actor=None
    ).source
    row = PipelineRow.objects.get(name=pipeline)
    nightly = {"name": "nightly", "type": "cron", "schedule": "0 3 * * *", "timezone": "UTC", "inputs": {}}
    triggers.triggers_reconcile(row, [nightly])
    return Place(
        namespace,
        stand,
        held,
        run,
        agent,
        command,
        artifact,
        pipeline,
        secret,
        account.name,
        str(account_token.pk),
        revision.revision.digest,
        archive,
        source.name,
        str(TriggerRow.objects.get(pipeline=row).pk),
    )


@pytest.fixture
def places() -> dict[str, Place]:
    factories.bind_namespace(OTHER)
    return {"default": _place("default", "sample.noop"), OTHER: _place(OTHER, "sample.team-b")}


def _client(user: Any) -> APIClient:

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {factories.api_token(user)}")
    return client


# (method, path, body): every REST route, filled in from a Place. ``test_the_table_covers_*``
# fails when a route is added without a line here.
def _routes(p: Place) -> list[tuple[str, str, Any]]:
    return [
        ("GET", "/api/v1/", None),
        ("GET", "/api/v1/whoami/", None),
        ("GET", "/api/v1/kinds/", None),
        ("GET", "/api/v1/kinds/test.sleep/", None),
        ("GET", "/api/v1/records/", None),
        ("POST", "/api/v1/records/", {"kind": "test.sleep", "name": "new", "owner": str(p.stand.pk), "spec": {}}),
        ("GET", f"/api/v1/records/{p.held.pk}/", None),
        ("DELETE", f"/api/v1/records/{p.held.pk}/", None),
        ("GET", f"/api/v1/records/{p.held.pk}/tree/", None),
        ("GET", f"/api/v1/records/{p.held.pk}/events/", None),
        ("GET", f"/api/v1/records/{p.held.pk}/logs/", None),
        ("GET", f"/api/v1/records/{p.held.pk}/logs/stream/", None),
        ("GET", f"/api/v1/records/{p.held.pk}/metrics/", None),
        ("POST", f"/api/v1/records/{p.held.pk}/transfer/", {"to": str(p.stand.pk)}),
        ("POST", f"/api/v1/records/{p.held.pk}/extend/", {"by_seconds": 60}),
        ("POST", f"/api/v1/records/{p.held.pk}/release/", None),
        ("POST", f"/api/v1/records/{p.held.pk}/protect/", None),
        ("POST", f"/api/v1/records/{p.held.pk}/unprotect/", None),
        ("GET", "/api/v1/orphans/", None),
        ("POST", "/api/v1/orphans/sweep/?dry_run=true", None),
        ("GET", "/api/v1/pipelines/", None),
        ("GET", f"/api/v1/pipelines/{p.pipeline}/", None),
        ("POST", f"/api/v1/pipelines/{p.pipeline}/runs/", {"inputs": {"steps": 0}}),
        ("POST", f"/api/v1/pipelines/{p.pipeline}/plan/", {"inputs": {"steps": 0}}),
        ("POST", f"/api/v1/pipelines/{p.pipeline}/activate/", {"revision": p.revision}),
        ("GET", f"/api/v1/pipelines/{p.pipeline}/events/", None),
        ("GET", "/api/v1/triggers/", None),
        ("GET", f"/api/v1/triggers/{p.trigger}/", None),
        ("GET", f"/api/v1/triggers/{p.trigger}/events/", None),
        ("POST", f"/api/v1/triggers/{p.trigger}/pause/", None),
        ("POST", f"/api/v1/triggers/{p.trigger}/resume/", None),
        ("GET", "/api/v1/revisions/", None),
        ("GET", f"/api/v1/revisions/{p.revision}/", None),
        ("POST", f"/api/v1/revisions/?namespace={p.namespace}", p.archive),
        ("GET", f"/api/v1/sources/?namespace={p.namespace}", None),
        (
            "POST",
            f"/api/v1/sources/?namespace={p.namespace}",
            {"name": "fresh", "url": "git://127.0.0.1:9/fresh.git", "ref": "main"},
        ),
        ("GET", f"/api/v1/sources/{p.source}/?namespace={p.namespace}", None),
        (
            "PUT",
            f"/api/v1/sources/{p.source}/?namespace={p.namespace}",
            {"url": "git://127.0.0.1:9/a.git", "ref": "v2"},
        ),
        ("PATCH", f"/api/v1/sources/{p.source}/?namespace={p.namespace}", {"ref": "v3"}),
        ("DELETE", f"/api/v1/sources/{p.source}/?namespace={p.namespace}", None),
        ("POST", f"/api/v1/sources/{p.source}/sync/?namespace={p.namespace}", None),
        ("GET", "/api/v1/runs/", None),
        ("GET", f"/api/v1/runs/{p.run.pk}/", None),
        ("GET", f"/api/v1/runs/{p.run.pk}/events/", None),
        ("GET", f"/api/v1/runs/{p.run.pk}/trace/", None),
        ("POST", f"/api/v1/runs/{p.run.pk}/cancel/", None),
        ("POST", f"/api/v1/runs/{p.run.pk}/resume/", None),
        ("GET", "/api/v1/stands/", None),
        ("GET", f"/api/v1/stands/{p.pipeline}/", None),
        ("POST", f"/api/v1/stands/{p.pipeline}/extend/", {"record": str(p.held.pk), "by_seconds": 60}),
        ("POST", f"/api/v1/stands/{p.pipeline}/release/", {"record": str(p.held.pk)}),
        ("GET", "/api/v1/agents/", None),
        ("POST", "/api/v1/agents/", {"name": "new-box", "namespace": p.namespace}),
        ("GET", f"/api/v1/agents/{p.agent.pk}/", None),
        ("GET", f"/api/v1/agents/{p.agent.pk}/commands/", None),
        ("GET", f"/api/v1/agents/{p.agent.pk}/commands/{p.command.pk}/", None),
        ("POST", f"/api/v1/agents/{p.agent.pk}/commands/{p.command.pk}/cancel/", None),
        ("POST", f"/api/v1/agents/{p.agent.pk}/exec/", {"argv": ["true"]}),
        ("GET", f"/api/v1/secrets/?namespace={p.namespace}", None),
        ("POST", f"/api/v1/secrets/?namespace={p.namespace}", {"name": "fresh", "value": "v"}),
        ("GET", f"/api/v1/secrets/{p.secret}/?namespace={p.namespace}", None),
        ("PUT", f"/api/v1/secrets/{p.secret}/?namespace={p.namespace}", {"value": "w"}),
        ("DELETE", f"/api/v1/secrets/{p.secret}/?namespace={p.namespace}", None),
        ("GET", "/api/v1/artifacts/", None),
        ("GET", f"/api/v1/artifacts/{p.artifact.pk}/", None),
        ("GET", f"/api/v1/artifacts/{p.artifact.pk}/content/", None),
        ("POST", f"/api/v1/artifacts/?name=up.txt&owner={p.stand.pk}", None),
        ("GET", "/api/v1/namespaces/", None),
        ("POST", "/api/v1/namespaces/", {"name": "team-new"}),
        ("GET", f"/api/v1/namespaces/{p.namespace}/", None),
        ("DELETE", f"/api/v1/namespaces/{p.namespace}/", None),
        ("GET", "/api/v1/roles/", None),
        ("POST", "/api/v1/roles/", {"name": "custom", "rules": [{"verbs": ["get"], "resources": ["runs"]}]}),
        ("GET", "/api/v1/roles/viewer/", None),
        ("DELETE", "/api/v1/roles/viewer/", None),
        ("GET", "/api/v1/rolebindings/", None),
        ("POST", "/api/v1/rolebindings/", {"role": "admin", "namespace": p.namespace, "user": "vera"}),
        ("DELETE", f"/api/v1/rolebindings/{_a_binding(p.namespace)}/", None),
        ("GET", f"/api/v1/accounts/?namespace={p.namespace}", None),
        ("POST", f"/api/v1/accounts/?namespace={p.namespace}", {"name": "fresh-sa"}),
        ("GET", f"/api/v1/accounts/{p.account}/?namespace={p.namespace}", None),
        ("DELETE", f"/api/v1/accounts/{p.account}/?namespace={p.namespace}", None),
        ("GET", f"/api/v1/accounts/{p.account}/tokens/?namespace={p.namespace}", None),
        ("POST", f"/api/v1/accounts/{p.account}/tokens/?namespace={p.namespace}", {}),
        ("DELETE", f"/api/v1/accounts/{p.account}/tokens/?namespace={p.namespace}", None),
        ("DELETE", f"/api/v1/accounts/{p.account}/tokens/{p.account_token}/?namespace={p.namespace}", None),
        # A caller's own tokens: in no namespace; another's token is not found.
        ("GET", "/api/v1/tokens/", None),
        ("POST", "/api/v1/tokens/", {"comment": "mine"}),
        ("GET", f"/api/v1/tokens/{p.account_token}/", None),
        ("DELETE", f"/api/v1/tokens/{p.account_token}/", None),
        ("GET", f"/api/v1/audit/?namespace={p.namespace}", None),
    ]


def _a_binding(namespace: str) -> int:
    binding = RoleBinding.objects.filter(namespace=namespace).order_by("pk").first()
    return binding.pk if binding is not None else 0


def _send(client: APIClient, method: str, path: str, body: Any) -> Any:
    if method == "POST" and "/artifacts/?" in path:
        return client.generic("POST", path, "bytes", content_type="application/octet-stream")
    if isinstance(body, bytes):  # an archive of pipeline code
        return client.generic(method, path, body, content_type="application/gzip")  # type: ignore[arg-type]
    if body is None:
        return client.generic(method, path)
    return client.generic(method, path, json.dumps(body), content_type="application/json")


def test_the_table_covers_every_rest_route(places: dict[str, Place]) -> None:
    """Each DRF route and method of the URLconf is tried by the tests below."""
    resolver = get_resolver()
    # resolve() raises if the table names a route that does not exist
    tried = {(m, resolver.resolve(path.split("?")[0]).route) for m, path, _ in _routes(places["default"])}
    served: set[tuple[str, str]] = set()
    for route, callback, _name in _walk(resolver.url_patterns):
        if getattr(callback, "cls", None) is None or "format" in route or _name in OPEN_ROUTES:
            continue
        actions = getattr(callback, "actions", None) or {
            m: m for m in callback.cls.http_method_names if hasattr(callback.cls, m) and m != "options"
        }
        for method in actions:
            if method == "head":
                continue  # DRF adds it to a viewset's GET routes once they have served a GET
            served.add((method.upper(), route.replace("/^", "/")))  # resolve() drops the anchors
    assert served <= tried, f"routes no test tries: {sorted(served - tried)}"


def test_an_anonymous_caller_gets_401_on_every_route(places: dict[str, Place], settings: Any) -> None:
    # Every route is tried in one minute from one address: the limit on failed authentications
    # (its own tests: tests/core/test_auth_throttle.py) would answer 429 from the eleventh on.
    settings.GRAPHENE_AUTH_FAILURES_PER_MINUTE = 0
    anonymous = APIClient()
    for method, path, body in _routes(places["default"]):
        response = _send(anonymous, method, path, body)
        assert response.status_code == 401, (method, path, response.status_code)
        assert response.json()["error"] == "not_authenticated", (method, path)


def test_a_viewer_reads_and_cannot_write(places: dict[str, Place], django_user_model: Any) -> None:
    vera = django_user_model.objects.create_user(username="vera", password="pw")
    factories.bind(vera, "viewer")
    viewer = _client(vera)
    before = (Record.objects.count(), RoleBinding.objects.count())
    for method, path, body in _routes(places["default"]):
        response = _send(viewer, method, path, body)
        if path.startswith("/api/v1/tokens/"):
            # Its own tokens: it lists and makes them; a service account's token is none of its own.
            expected = {200} if path == "/api/v1/tokens/" and method == "GET" else {201} if method == "POST" else {404}
            assert response.status_code in expected, (method, path, response.status_code, response.content[:200])
        elif method == "GET":
            # A viewer does not even read secrets' names or accounts; the sweeper's findings span
            # every namespace; the audit trail names secrets and accounts (docs/audit.md).
            refused = "/secrets/" in path or "/orphans/" in path or "/accounts/" in path or "/audit/" in path
            expected = {403} if refused else {200}
            assert response.status_code in expected, (path, response.status_code, response.content[:200])
        elif path.endswith("/plan/"):
            # A plan does nothing and writes nothing: who may see the pipeline may plan it.
            assert response.status_code == 200, (method, path, response.status_code, response.content[:200])
        else:
            assert response.status_code == 403, (method, path, response.status_code, response.content[:200])
    assert (Record.objects.count(), RoleBinding.objects.count()) == before


def test_a_developer_of_one_namespace_neither_sees_nor_touches_another(
    places: dict[str, Place], django_user_model: Any
) -> None:
    dev = django_user_model.objects.create_user(username="dev", password="pw")
    factories.bind(dev, "developer")
    client = _client(dev)
    other = places[OTHER]
    for method, path, body in _routes(other):
        if path.startswith(("/api/v1/whoami", "/api/v1/kinds", "/api/v1/roles/")) or path == "/api/v1/":
            continue  # the same for everyone: nothing in them belongs to a namespace
        if (method, path) == ("POST", "/api/v1/tokens/"):
            continue  # a token of one's own: in no namespace
        response = _send(client, method, path, body)
        is_list = method == "GET" and path.split("?")[0].rstrip("/").count("/") == 3
        if is_list and response.status_code == 200:
            rows = _all(client, path, response)
            assert all(row.get("namespace", "default") == "default" for row in rows), (path, rows)
            ids = {str(row.get("id")) for row in rows}
            for thing in (other.held, other.run, other.agent, other.artifact, other.stand):
                assert str(thing.pk) not in ids, (path, thing)
        else:
            assert response.status_code in (403, 404), (method, path, response.status_code, response.content[:300])
    # listing counts: exactly the default namespace's, and the other namespace is untouched
    listed = _all(client, "/api/v1/records/", client.get("/api/v1/records/"))
    assert len(listed) == Record.objects.filter(namespace="default").count()
    assert Record.objects.filter(namespace=OTHER, deletion_requested_at__isnull=False).count() == 0
    assert pipelines_runs_in(OTHER) == 1


def pipelines_runs_in(namespace: str) -> int:
    from apps.pipelines.models import Run

    return Run.objects.filter(namespace=namespace).count()


def _all(client: APIClient, path: str, first: Any) -> list[dict[str, Any]]:
    body = first.json()
    if isinstance(body, list):
        return body
    rows = list(body["results"])
    while body.get("next"):
        body = client.get(body["next"]).json()
        rows += body["results"]
    return rows


def test_an_admin_of_every_namespace_sees_both(places: dict[str, Place], admin_api: APIClient) -> None:
    """The lists above are narrowed, not empty by accident: an admin bound in * sees both."""
    namespaces = {row["namespace"] for row in _all(admin_api, "/api/v1/runs/", admin_api.get("/api/v1/runs/"))}
    assert namespaces == {"default", OTHER}
    only = _all(admin_api, f"/api/v1/records/?namespace={OTHER}", admin_api.get(f"/api/v1/records/?namespace={OTHER}"))
    assert {row["namespace"] for row in only} == {OTHER}


# --- websockets --------------------------------------------------------------------------------


def _connect(user: Any, path: str) -> tuple[bool, Any]:
    """``(accepted and left open, close code)``. A terminal accepts first, to say why in a
    message, then closes: that counts as refused with its code."""

    async def attempt() -> tuple[bool, Any]:
        communicator = WebsocketCommunicator(WithUser(URLRouter(websocket_urlpatterns), user), path)
        connected, code = await communicator.connect(timeout=10)
        if connected and "/pty/" in path:
            while (output := await communicator.receive_output(timeout=10))["type"] != "websocket.close":
                pass
            return False, output.get("code")
        await communicator.disconnect()
        return connected, code

    return async_to_sync(attempt)()


@pytest.mark.django_db(transaction=True)  # the consumers read the database from their own threads
def test_websockets_refuse_the_anonymous_and_what_another_namespace_holds(
    places: dict[str, Place], django_user_model: Any
) -> None:
    from django.contrib.auth.models import AnonymousUser

    other = places[OTHER]
    paths = [
        "/ws/records/",
        f"/ws/records/{other.held.pk}/logs/",
        "/ws/runs/",
        f"/ws/runs/{other.run.pk}/",
        f"/ws/agents/{other.agent.pk}/pty/",
    ]
    for path in paths:
        assert _connect(AnonymousUser(), path) == (False, 4401), path
    dev = django_user_model.objects.create_user(username="dev", password="pw")
    factories.bind(dev, "developer")
    assert _connect(dev, f"/ws/runs/{other.run.pk}/") == (False, 4404)
    assert _connect(dev, f"/ws/runs/{places['default'].run.pk}/")[0] is True
    nobody = django_user_model.objects.create_user(username="nobody", password="pw")
    assert _connect(nobody, "/ws/records/") == (False, 4403)


@pytest.mark.django_db(transaction=True)
def test_record_hints_reach_only_watchers_of_their_namespace(
    django_user_model: Any, django_capture_on_commit_callbacks: Any
) -> None:
    factories.bind_namespace(OTHER)
    dev = django_user_model.objects.create_user(username="dev", password="pw")
    factories.bind(dev, "developer")

    async def watch() -> list[Any]:
        communicator = WebsocketCommunicator(WithUser(URLRouter(websocket_urlpatterns), dev), "/ws/records/")
        assert (await communicator.connect(timeout=10))[0]

        def declare(name: str, namespace: str) -> str:
            with django_capture_on_commit_callbacks(execute=True):
                return str(records.record_create_root(kind="graphene.stand", name=name, namespace=namespace).pk)

        theirs = await sync_to_async(declare)("theirs", OTHER)
        # Hints come in order: once the later one of the default namespace is heard, the other
        # namespace's would have been heard before it.
        mine = await sync_to_async(declare)("mine", access.DEFAULT_NAMESPACE)
        heard: list[str] = []
        while mine not in heard:
            heard += (await communicator.receive_json_from(timeout=10))["ids"]
        await communicator.disconnect()
        return [theirs, heard]

    theirs, heard = async_to_sync(watch)()
    assert theirs not in heard


def test_the_studio_shows_a_developer_only_their_namespace(places: dict[str, Place], django_user_model: Any) -> None:
    dev = django_user_model.objects.create_user(username="dev", password="pw")
    factories.bind(dev, "developer")
    studio = Client()
    studio.force_login(dev)
    page = studio.get("/runs/").content.decode()
    assert str(places["default"].run.pk) in page
    assert str(places[OTHER].run.pk) not in page
    assert studio.get(f"/runs/{places[OTHER].run.pk}/").status_code == 404
    assert studio.get(f"/records/record/{places[OTHER].held.pk}/change/").status_code == 404
    assert studio.post(f"/runs/{places[OTHER].run.pk}/cancel/").status_code == 404
    assert studio.get(f"/pipelines/{places[OTHER].pipeline}/").status_code == 404
    admin = django_user_model.objects.create_user(username="root-ops", password="pw", is_staff=True)
    factories.bind(admin, "admin", "*")
    studio.force_login(admin)
    only = studio.get(f"/runs/?namespace={OTHER}").content.decode()
    assert str(places[OTHER].run.pk) in only
    assert str(places["default"].run.pk) not in only
