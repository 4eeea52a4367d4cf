"""Swagger UI at /api/docs/, over the schema, with its files served by Graphene (no CDN)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.test import Client

pytestmark = pytest.mark.django_db


def test_swagger_ui_is_served_from_the_sidecar_not_a_cdn(user: Any) -> None:
    client = Client()
    client.force_login(user)
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "/api/schema/" in html
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    scripts = [a for a in assets if a.endswith(".js")]
    assert scripts, html
    for asset in assets:
        assert not asset.startswith(("http:", "https:", "//")), f"{asset} comes from outside"
        assert asset.startswith("/static/"), asset
        assert finders.find(asset.removeprefix("/static/")), f"{asset} is not among the static files"


def test_the_docs_and_the_schema_need_a_login() -> None:
    for path in ("/api/docs/", "/api/schema/"):
        response = Client().get(path)
        assert response.status_code in (401, 403), (path, response.status_code)
        assert response.json()["error"] in ("not_authenticated", "authentication_failed"), response.json()
