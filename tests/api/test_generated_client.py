"""A client generated from the schema works: openapi-python-client turns ``/api/schema/`` into
a typed package (offline), which starts a run of a sample pipeline on the real server, with
the shared workers running it, and reads it back, journal included, through its own models.

openapi-python-client lives in a virtualenv of its own (``make setup``: ``.venv/codegen``,
pinned by ``requirements/codegen.txt``): it pins an older typer than graphenectl's. The
generated package needs only httpx, attrs and python-dateutil, which the project's has.
"""

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

from tests import factories
from tests.conftest import Worker, wait_for
from tests.harness import tls
from tests.harness.net import fetch
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

PACKAGE = "graphene_api_client"
GENERATOR = Path(sys.executable).parent.parent / "codegen" / "bin" / "openapi-python-client"


def generate(schema: dict[str, Any], where: Path) -> None:
    """The client package ``PACKAGE`` generated into ``where`` (no formatting hooks)."""
    (where / "schema.json").write_text(json.dumps(schema))
    (where / "config.yaml").write_text(f"package_name_override: {PACKAGE}\npost_hooks: []\n")
    assert GENERATOR.exists(), f"{GENERATOR} is missing: run make setup"
    done = subprocess.run(  # the pinned generator, on a file this test wrote
        [
            str(GENERATOR),
            "generate",
            "--path",
            "schema.json",
            "--config",
            "config.yaml",
            "--output-path",
            PACKAGE,
            "--meta",
            "none",
        ],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # Every operation and model came through: the generator names what it had to skip.
    assert "Warning" not in output, output
    assert "Unable" not in output, output


def test_a_generated_client_starts_a_run_and_reads_it_back(
    web: WebServer, workers: list[Worker], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = get_user_model().objects.create_user(username="generated", password="pw")
    factories.bind(user, "developer")
    token = Token.objects.create(user=user).key
    status, raw = fetch(f"{web.url}/api/schema/?format=json", token=token)
    assert status == 200, raw[:300]
    generate(json.loads(raw), tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    client_module = importlib.import_module(PACKAGE)
    start = importlib.import_module(f"{PACKAGE}.api.v1.v1_pipelines_runs_create")
    get = importlib.import_module(f"{PACKAGE}.api.v1.v1_runs_retrieve")
    models = importlib.import_module(f"{PACKAGE}.models")

    with client_module.AuthenticatedClient(
        base_url=web.url, token=token, prefix="Token", verify_ssl=tls.context()
    ) as client:
        body = models.RunStartInputRequest(inputs=models.RunStartInputRequestInputs.from_dict({"steps": 3}))
        started = start.sync(name="sample.noop", client=client, body=body)
        assert isinstance(started, models.RunOutput), started
        assert started.pipeline == "sample.noop"
        assert started.inputs == {"steps": 3}

        def finished() -> Any:
            run = get.sync(id=started.id, client=client)
            assert isinstance(run, models.RunDetailOutput), run
            return run if run.status == models.RunStatusEnum.SUCCEEDED else None

        run = wait_for(finished, timeout=60, what="the run started by the generated client to succeed")
        assert run.id == started.id
        assert run.number == started.number
        assert [entry.call for entry in run.journal] == ["step noop-0", "step noop-1", "step noop-2"]
        assert run.journal_truncated is False

        # An error answer comes back as the declared Error model, not a parse failure.
        missing = start.sync(name="no.such.pipeline", client=client, body=body)
        assert isinstance(missing, models.Error), missing
        assert missing.error.endswith("not_found"), missing.to_dict()
