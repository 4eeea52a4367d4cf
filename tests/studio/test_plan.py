"""A pipeline's page shows the plan of a run as a tree — for the default inputs, or for the
form's inputs when Plan is pressed — and its calls in order, starting nothing; inputs the
defaults cannot fill, inputs the schema refuses and code that raises are said on the page.
Served by Django's test client (the CSP browser test opens the page in Chromium)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from apps.pipelines.delivery import revisions
from apps.pipelines.models import Run
from tests import factories

pytestmark = pytest.mark.django_db


def _rows(page: str) -> list[tuple[int, str]]:
    tree = page.split('id="plan-tree"')[1].split("</ul>")[0]
    return [(int(level), label.strip()) for level, label in re.findall(r'data-level="(\d+)"[^>]*>([^<]+)', tree)]


def test_the_page_plans_nothing_until_asked_then_shows_the_plan_for_the_default_inputs(studio: Client) -> None:
    plain = studio.get("/pipelines/sample.tree/").content.decode()
    assert 'id="plan-defaults"' in plain
    assert 'id="plan-tree"' not in plain
    page = studio.get("/pipelines/sample.tree/?plan=1").content.decode()
    assert "with the default inputs" in page
    assert _rows(page) == [
        (0, "run sample.tree"),
        (1, "test.sleep/branch-0"),
        (2, "test.sleep/leaf-0-0"),
        (2, "test.sleep/leaf-0-1"),
        (1, "test.sleep/branch-1"),
        (2, "test.sleep/leaf-1-0"),
        (2, "test.sleep/leaf-1-1"),
    ]
    calls = page.split('id="plan-calls"')[1].split("</details>")[0]
    assert calls.count('data-op="declare"') == 6
    assert calls.count('data-op="step"') == 2
    assert "&lt;test.sleep branch-0: outputs.object&gt;" in calls  # a placeholder, escaped
    assert 'id="plan-stopped"' not in page
    assert not Run.objects.exists()


def test_plan_shows_the_forms_inputs_and_starts_nothing(studio: Client) -> None:
    page = studio.post("/pipelines/sample.tree/", {"branches": "1", "leaves": "0", "plan": "Plan"}).content.decode()
    assert "with the inputs above" in page
    assert _rows(page) == [(0, "run sample.tree"), (1, "test.sleep/branch-0")]
    assert 'value="1"' in page  # what was typed stays in the form
    refused = studio.post("/pipelines/sample.tree/", {"branches": "11", "leaves": "0", "plan": "Plan"})
    field = refused.content.decode().split('data-field="branches"')[1].split("</div>")[0]
    assert "less than or equal to 10" in field  # the server's validation, on the field it names
    assert 'id="plan-tree"' not in refused.content.decode()
    assert not Run.objects.exists()


def test_inputs_the_defaults_cannot_fill_ask_for_the_form(studio: Client) -> None:
    page = studio.get("/pipelines/sample.form/?plan=1").content.decode()  # ``branch`` has no default
    problems = page.split('id="plan-errors"')[1].split("</ul>")[0]
    assert "give the inputs above and press Plan" in problems
    planned = studio.post("/pipelines/sample.form/", {"branch": "dev", "plan": "Plan"}).content.decode()
    assert _rows(planned) == [(0, "run sample.form")]
    assert "started on dev" in planned.split('id="plan-calls"')[1]


def test_code_that_raises_is_said_on_the_page(studio: Client, tmp_path: Path) -> None:
    root = tmp_path / "code"
    root.mkdir()
    (root / "broken.py").write_text(
        textwrap.dedent(
            """
            from pydantic import BaseModel
            from graphene_sdk import pipeline

            class In(BaseModel):
                pass

            @pipeline("studio.plan-raises", inputs=In)
            def broken(ctx, inputs):
                raise RuntimeError("not today")
            """
        )
    )
    revisions.revision_materialize(tree=root, namespace="default", activate=True)
    page = studio.get("/pipelines/studio.plan-raises/?plan=1").content.decode()
    problems = page.split('id="plan-errors"')[1].split("</ul>")[0]
    assert "the pipeline raised RuntimeError: not today" in problems
    assert "broken.py" in problems  # the traceback's tail


def test_a_viewer_sees_the_plan(django_user_model: Any) -> None:
    vera = django_user_model.objects.create_user(username="vera", password="pw")
    factories.bind(vera, "viewer")
    client = Client()
    client.force_login(vera)
    page = client.get("/pipelines/sample.tree/?plan=1")
    assert page.status_code == 200
    assert _rows(page.content.decode())[0] == (0, "run sample.tree")
