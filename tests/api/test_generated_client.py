"""A client generated from the schema works: openapi-python-client turns ``/api/schema/`` into
a typed package (no network needed), which starts a run of a sample pipeline on the real
server and reads it back, journal included, through its own models."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from tests.conftest import Worker, wait_for
from tests.harness.net import fetch
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

PACKAGE = "graphene_api_client"


def generate(schema: dict[str, Any], where: Path) -> Path:
    """The client package generated into ``where``; ``post_hooks`` off (nothing is formatted)."""
    (where / "schema.json").write_text(json.dumps(schema))
    (where / "config.yaml").write_text(
        f"project_name_override: graphene-api-client\npackage_name_override: {PACKAGE}\npost_hooks: []\n"
    )
    tool = Path(sys.executable).parent / "openapi-python-client"
    done = subprocess.run(
        [
            str(tool),
            "generate",
            "--path",
            "schema.json",
            "--config",
            "config.yaml",
            "--output-path",
            "client",
            "--meta",
            "none",
        ],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr
    return where / "client"


def test_a_generated_client_starts_a_run_and_reads_it_back(
    web: WebServer, workers: list[Worker], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = get_user_model().objects.create_user(username="generated", password="pw")
    token = Token.objects.create(user=user).key
    status, raw = fetch(f"{web.url}/api/schema/?format=json", token=token)
    assert status == 200, raw[:300]
    root = generate(json.loads(raw), tmp_path)
    monkeypatch.syspath_prepend(str(root.parent))
    client_mod = importlib.import_module(f"client")
    ...
