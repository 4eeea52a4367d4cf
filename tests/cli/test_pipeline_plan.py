"""``graphenectl pipeline plan`` shows what a run would do without doing it: the tree of what it
would own and its calls in order as text, the API's answer as JSON, a Mermaid flowchart of
ownership and dependencies; inputs are checked before anything is sent, and code that raises
is reported with its traceback. Against the shared web server, as a developer of the default
namespace."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from apps.pipelines.models import Run
from apps.records.models import Record
from tests.factories import api_token
from tests.harness.embedded import Ctl
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

CODE = """
from datetime import timedelta

from pydantic import BaseModel
from graphene_sdk import Context, pipeline
from graphene_sdk.libs import docker


class In(BaseModel):
    tag: str = "1.0"
    fail: bool = False


@pipeline("{name}", inputs=In)
def deploy(ctx: Context, inputs: In) -> None:
    if inputs.fail:
        raise ValueError("no deploys on fridays")
    net = docker.network(ctx, "net")
    web = docker.container(ctx, "web", image=f"nginx:{{inputs.tag}}", network=net)
    address = web.ready()["ip_address"]
    ctx.step("smoke", print, f"http://{{address}}/")
    ctx.to_stand(web, keep_for=timedelta(hours=1))
"""


@pytest.fixture
def ctl(web: WebServer, user: Any, tmp_path: Path) -> Ctl:
    return Ctl(tmp_path / "config", **web.client_env(), GRAPHENE_TOKEN=api_token(user))


@pytest.fixture
def pipeline(ctl: Ctl, tmp_path: Path) -> str:
    name = f"plancli.{uuid.uuid4().hex[:8]}"
    root = tmp_path / "code"
    root.mkdir()
    (root / "deploy.py").write_text(textwrap.dedent(CODE.format(name=name)))
    ctl.ok("pipeline", "push", str(root))
    return name


def test_plan_as_text_json_and_mermaid(ctl: Ctl, pipeline: str) -> None:
    text = ctl.ok("pipeline", "plan", pipeline, "-i", "tag=1.27").out
    lines = text.splitlines()
    assert lines[0].startswith(f"plan of {pipeline} (revision ")
    assert lines[0].endswith('with inputs {"tag": "1.27", "fail": false}')
    tree = "\n".join(lines[1 : lines.index("calls, in order:")])
    assert f"run {pipeline}" in tree
    assert "docker.network/net" in tree
    assert f"stand {pipeline}\n└── docker.container/web" in tree
    calls = lines[lines.index("calls, in order:") + 1 :]
    assert calls[0] == "  1  declare docker.network/net (owner: run)"
    assert calls[2] == "  2  declare docker.container/web (owner: run)"
    assert '"image": "nginx:1.27"' in calls[3]
    assert '"network": "g-net-<docker.network net: id>"' in calls[3]
    assert calls[4] == "  3  wait until docker.container web is ready"
    assert calls[5] == '  4  step smoke: builtins.print("http://<docker.container web: outputs.ip_address>/")'
    assert calls[6] == f"  5  hand docker.container web to the stand {pipeline} for 1h"

    body = json.loads(ctl.ok("pipeline", "plan", pipeline, "-o", "json").out)
    assert body["pipeline"] == pipeline
    assert body["complete"] is True
    assert [e["op"] for e in body["entries"]] == ["declare", "declare", "ready", "step", "to_stand"]

    chart = ctl.ok("pipeline", "plan", pipeline, "-o", "mermaid").out.splitlines()
    assert chart[0] == "flowchart TD"
    assert f'  n1(["run {pipeline}"])' in chart
    assert '  n2["docker.network/net"]' in chart
    assert "  n1 --> n2" in chart  # the run owns the network
    assert f'  n3[("stand {pipeline}")]' in chart
    assert '  n4["docker.container/web"]' in chart
    assert "  n3 --> n4" in chart  # the stand holds the container
    assert '  n5[["step smoke"]]' in chart
    assert "  n2 -. uses .-> n4" in chart  # the container's spec names the network
    assert "  n4 -. uses .-> n5" in chart  # the step reads the container's address
    assert not Run.objects.exists()
    assert not Record.objects.filter(kind__startswith="docker.").exists()


def test_plan_checks_inputs_first_and_reports_a_failing_pipeline(ctl: Ctl, pipeline: str) -> None:
    bad = ctl("pipeline", "plan", pipeline, "-i", "fail=maybe")
    assert bad.code == 2, bad.err
    assert "do not match its schema; nothing was planned" in bad.err
    failed = ctl("pipeline", "plan", pipeline, "-i", "fail=true")
    assert failed.code == 2, failed.err
    assert "Traceback" in failed.err
    assert "deploy.py" in failed.err
    assert f"pipeline {pipeline} cannot be planned: the pipeline raised ValueError: no deploys on fridays" in failed.err
    missing = ctl("pipeline", "plan", "no.such.pipeline")
    assert missing.code == 3, missing.err


def test_plan_help_says_what_it_does(ctl: Ctl) -> None:
    shown = ctl.ok("pipeline", "plan", "--help").out
    assert "without doing it" in shown
    assert "--revision" in shown
    assert "text" in shown
    assert "mermaid" in shown
