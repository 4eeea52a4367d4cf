"""Security headers on every answer, and the Studio's Content-Security-Policy (apps/core/security.py):
Studio pages, the API's answers (its rewritten errors too), and the static files daphne serves."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import Client
from rest_framework.authtoken.models import Token

from apps.core.security import API_POLICY
from tests.harness.net import fetch_response
from tests.harness.web import WebServer

BASELINE = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}
STUDIO_DIRECTIVES = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data:",
    "font-src": "'self'",
    "connect-src": "'self' ws://testserver wss://testserver",
    "object-src": "'none'",
    "base-uri": "'self'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}


def directives(policy: str) -> dict[str, str]:
    return dict(part.strip().split(" ", 1) for part in policy.split(";"))


def assert_baseline(response: HttpResponse | Any) -> None:
    assert {name: response.get(name) for name in BASELINE} == BASELINE
    assert "Strict-Transport-Security" not in response, "HSTS only on a secure request"


@pytest.fixture
def studio(django_user_model: Any) -> Client:
    client = Client()
    client.force_login(django_user_model.objects.create_superuser(username="ada", password="pw"))
    return client


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path", ["/", "/runs/", "/pipelines/", "/stands/", "/agents/", "/artifacts/", "/records/record/"]
)
def test_studio_pages_carry_the_headers_and_the_strict_policy_with_nothing_inline(studio: Client, path: str) -> None:
    response = studio.get(path)
    assert response.status_code == 200
    assert_baseline(response)
    assert directives(response["Content-Security-Policy"]) == STUDIO_DIRECTIVES
    html = response.content.decode()
    # What the policy would refuse: a script without src, an event handler, a style= attribute
    # or a <style> element, a javascript: URL.
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) == []
    assert re.findall(r"<[^>]+\s(on[a-z]+|style)=", html) == []
    assert "<style" not in html
    assert "javascript:" not in html
    # htmx is told to inject no styles of its own and to evaluate nothing.
    assert '"includeIndicatorStyles": false' in html
    assert '"allowEval": false' in html


@pytest.mark.django_db
def test_the_login_page_and_a_missing_page_carry_them_too(client: Client) -> None:
    for response in (client.get("/login/"), client.get("/no/such/page/")):
        assert_baseline(response)
        assert directives(response["Content-Security-Policy"]) == STUDIO_DIRECTIVES


@pytest.mark.django_db
def test_api_answers_carry_the_headers_and_load_nothing(client: Client, user: Any) -> None:
    token = Token.objects.create(user=user).key
    ok = client.get("/api/v1/runs/", HTTP_AUTHORIZATION=f"Token {token}")
    missing = client.get("/api/v1/nothing-here/", HTTP_AUTHORIZATION=f"Token {token}")  # rewritten by ApiDoor
    refused = client.get("/api/v1/runs/", HTTP_AUTHORIZATION="Token nope")
    assert (ok.status_code, missing.status_code, refused.status_code) == (200, 404, 401)
    for response in (ok, missing, refused):
        assert_baseline(response)
        assert response["Content-Security-Policy"] == API_POLICY


@pytest.mark.django_db
def test_hsts_only_on_a_secure_request(client: Client, settings: Any) -> None:
    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = False
    settings.SECURE_HSTS_PRELOAD = False
    secure = client.get("/login/", secure=True)
    assert secure["Strict-Transport-Security"] == "max-age=3600"
    assert "Strict-Transport-Security" not in client.get("/login/")
    assert directives(secure["Content-Security-Policy"])["connect-src"] == "'self' wss://testserver", (
        "a secure page's websockets are wss: only"
    )


@pytest.mark.django_db
def test_only_the_terminal_page_allows_inline_styles_and_never_inline_scripts(studio: Client) -> None:
    from apps.agents import services as agents
    from apps.records.services import record_create_root

    stand = record_create_root(kind="graphene.stand", name="machines")
    agent = agents.agent_record_declare(owner=stand, name="box", labels={})
    terminal = studio.get(f"/agents/agent/{agent.pk}/terminal/")
    assert terminal.status_code == 200
    policy = directives(terminal["Content-Security-Policy"])
    assert policy == {**STUDIO_DIRECTIVES, "style-src": "'self' 'unsafe-inline'"}
    assert directives(studio.get(f"/agents/agent/{agent.pk}/change/")["Content-Security-Policy"]) == STUDIO_DIRECTIVES


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_the_static_files_daphne_serves_carry_the_same_headers(web: WebServer) -> None:
    for path in ("/static/studio/studio.js", "/static/admin/css/base.css", "/static/agents/vendor/xterm/xterm.js"):
        status, headers, _ = fetch_response(f"{web.url}{path}")
        assert status == 200, path
        assert {name: headers.get(name) for name in BASELINE} == BASELINE, path
        assert "script-src 'self'" in headers["Content-Security-Policy"], path
    status, headers, _ = fetch_response(f"{web.url}/login/")
    assert status == 200
    assert {name: headers.get(name) for name in BASELINE} == BASELINE
    connect = directives(headers["Content-Security-Policy"])["connect-src"]
    host = web.url.removeprefix("http://")
    assert connect == f"'self' ws://{host} wss://{host}"
