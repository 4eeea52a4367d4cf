"""Plans: ``POST /api/v1/pipelines/{name}/plan/`` runs the pipeline's code in a recording pass
and answers what a run would do — declarations with kinds, names and owners, steps, child runs
and agent calls, in order, with placeholders where it would read a value from outside — with
nothing done and nothing written. Inputs are checked as a start checks them; code that raises
or loops is a 422 saying so; a branch on a value the plan cannot know stops the plan there."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from graphene_sdk import Client, ClientError, _delivery
from rest_framework.test import APIClient

from apps.pipelines import services
from apps.pipelines.models import Revision, Run
from apps.records.models import Record
from tests import factories
from tests.harness.web import WebServer

pytestmark = pytest.mark.django_db

CODE = """
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, Field
from graphene_sdk import Context, pipeline
from graphene_sdk.libs import docker


class ProbeIn(BaseModel):
    url: str


class ProbeOut(BaseModel):
    status: str


@pipeline("{prefix}.probe", inputs=ProbeIn)
def probe(ctx: Context, inputs: ProbeIn) -> ProbeOut:
    job = docker.job(ctx, "probe", image="busybox", command=["wget", "-qO-", inputs.url])
    return ProbeOut(status=job.ready()["stdout_tail"])


class In(BaseModel):
    branch: str = "main"
    replicas: int = Field(default=2, ge=1, le=5)
    mode: Literal["normal", "raise", "loop", "branch"] = "normal"


def migrate(url: str) -> str:
    raise RuntimeError("a plan never calls a step's function")


@pipeline("{prefix}.env", inputs=In)
def env(ctx: Context, inputs: In) -> None:
    if inputs.mode == "raise":
        raise RuntimeError("the pipeline refuses to plan")
    while inputs.mode == "loop":
        pass
    net = docker.network(ctx, "net")
    db = docker.container(
        ctx, "db", image="postgres:16", network=net, env={{"POSTGRES_PASSWORD": ctx.secret("db-password")}}
    )
    for i in range(inputs.replicas):
        docker.container(ctx, f"app-{{i}}", image=f"app:{{inputs.branch}}", network=net, parent=db)
    address = db.ready()["ip_address"]
    version = ctx.step("migrate", migrate, f"postgres://{{address}}:5432/app")
    builder = ctx.agent("builder")
    result = builder.exec(["make", "test", f"DB={{address}}"])
    if not result.ok:
        raise RuntimeError(result.stderr_tail)
    checked = ctx.run(probe, ProbeIn(url=f"http://{{address}}/health"))
    ctx.log(f"schema {{version}}, probe said {{checked.status}}")
    ctx.to_stand(db, keep_for=timedelta(hours=4))
    if inputs.mode == "branch" and version == "v2":  # the line the plan stops at
        ctx.log("on v2")
"""
BRANCH_LINE = CODE.splitlines().index(
    '    if inputs.mode == "branch" and version == "v2":  # the line the plan stops at'
)


def _code(base: Path, prefix: str, *, replicas_default: int = 2) -> Path:
    root = base / f"code-{uuid.uuid4().hex[:6]}"
    root.mkdir()
    text = CODE.format(prefix=prefix).replace("default=2,", f"default={replicas_default},")
    (root / "plan_demo.py").write_text(textwrap.dedent(text))
    return root


def push(api: APIClient, directory: Path, *, activate: bool = True) -> dict[str, Any]:
    data = _delivery.pack(directory, max_bytes=10 * 1024**2)
    url = f"/api/v1/revisions/?namespace=default&activate={'true' if activate else 'false'}"
    answer = api.generic("POST", url, data, content_type="application/gzip")  # type: ignore[arg-type]  # bytes
    assert answer.status_code in (200, 201), answer.json()
    body: dict[str, Any] = answer.json()
    return body


@pytest.fixture
def demo(api: APIClient, tmp_path: Path) -> str:
    """The prefix of the demo pipelines, pushed as the active revision."""
    prefix = f"plan{uuid.uuid4().hex[:6]}"
    push(api, _code(tmp_path, prefix))
    return prefix


def plan(client: APIClient, name: str, body: dict[str, Any] | None = None) -> Any:
    return client.post(f"/api/v1/pipelines/{name}/plan/", body or {}, format="json")


def _by_op(entries: list[dict[str, Any]], op: str) -> list[dict[str, Any]]:
    return [e for e in entries if e["op"] == op]


def test_a_plan_lists_what_a_run_would_do_in_order_with_placeholders(api: APIClient, demo: str) -> None:
    answer = plan(api, f"{demo}.env", {"inputs": {"branch": "feature-x"}})
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert body["pipeline"] == f"{demo}.env"
    assert (
        body["revision"]
        == Revision.objects.get(namespace="default", manifest__pipelines__contains=[{"name": f"{demo}.env"}]).digest
    )
    assert body["inputs"] == {"branch": "feature-x", "replicas": 2, "mode": "normal"}  # as a start stores them
    assert body["complete"] is True
    assert body["stopped"] is None
    entries = body["entries"]
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    child = f"child run {demo}.probe"
    declared = {e["ref"]: e for e in _by_op(entries, "declare")}
    # Kinds, names and owners; a secret by its name only; a handle as a placeholder of its id.
    assert (declared["docker.container db"]["kind"], declared["docker.container db"]["name"]) == (
        "docker.container",
        "db",
    )
    assert declared["docker.container db"]["owner"] == "run"
    assert declared["docker.container app-1"]["owner"] == "docker.container db"
    assert declared["docker.job probe"]["owner"] == child
    assert declared["docker.container db"]["spec"]["env"] == {"POSTGRES_PASSWORD": {"$secret": "db-password"}}
    assert declared["docker.container db"]["spec"]["network"] == "g-net-<docker.network net: id>"
    assert declared["docker.container app-0"]["spec"]["image"] == "app:feature-x"
    assert declared["docker.container db"]["uses"] == ["docker.network net"]
    # What the run would read from outside is a placeholder, carried into later calls.
    address = "<docker.container db: outputs.ip_address>"
    (step,) = _by_op(entries, "step")
    assert step["args"] == [f"postgres://{address}:5432/app"]
    assert step["function"].endswith("plan_demo.migrate")
    assert step["uses"] == ["docker.container db"]
    (command,) = _by_op(entries, "exec")
    assert command["agent"] == "agent builder"
    assert command["argv"] == ["make", "test", f"DB={address}"]
    assert command["assumed"] == "exit code 0"
    (run,) = _by_op(entries, "run")
    assert run["pipeline"] == f"{demo}.probe"
    assert run["inputs"] == {"url": f"http://{address}/health"}
    assert declared["docker.job probe"]["spec"]["command"] == ["wget", "-qO-", f"http://{address}/health"]
    (log,) = _by_op(entries, "log")
    assert log["message"] == f"schema <step migrate: result>, probe said <{child}: output.status>"
    assert log["uses"] == [child, "step migrate"]
    (handover,) = _by_op(entries, "to_stand")
    assert (handover["stand"], handover["keep_for"]) == (f"stand {demo}.env", 4 * 3600)
    # The tree: the run owns the network, the agent and the child run (which owns its job); the
    # database and what it owns are on the stand.
    run_node, stand_node = body["tree"]
    assert (run_node["kind"], run_node["name"]) == ("graphene.run", f"{demo}.env")
    assert [n["ref"] for n in run_node["children"]] == ["docker.network net", "agent builder", child]
    assert [n["ref"] for n in run_node["children"][2]["children"]] == ["docker.job probe"]
    assert (stand_node["kind"], stand_node["name"]) == ("graphene.stand", f"{demo}.env")
    (db,) = stand_node["children"]
    assert db["ref"] == "docker.container db"
    assert [n["name"] for n in db["children"]] == ["app-0", "app-1"]


def test_the_order_of_a_plan(api: APIClient, demo: str) -> None:
    entries = plan(api, f"{demo}.env").json()["entries"]
    child = f"child run {demo}.probe"
    assert [(e["run"], e["op"], e.get("ref") or e.get("target") or e.get("value")) for e in entries] == [
        ("run", "declare", "docker.network net"),
        ("run", "declare", "docker.container db"),
        ("run", "declare", "docker.container app-0"),
        ("run", "declare", "docker.container app-1"),
        ("run", "ready", "docker.container db"),
        ("run", "step", "step migrate"),
        ("run", "declare", "agent builder"),
        ("run", "exec", "agent builder exec"),
        ("run", "run", child),
        (child, "declare", "docker.job probe"),
        (child, "ready", "docker.job probe"),
        ("run", "log", None),
        ("run", "to_stand", "docker.container db"),
    ]


def test_a_plan_writes_nothing(api: APIClient, demo: str) -> None:
    plan(api, f"{demo}.env")  # the revision's code is unpacked and imported once
    # GRAPHENE_PIPELINE_DIRS are delivered (as their own revisions) on any lookup that finds them
    # changed or missing, as after the previous test's flush: that is the installation's, not the plan's.
    services.pipelines_sync_all()
    with CaptureQueriesContext(connection) as queries:
        answer = plan(api, f"{demo}.env")
    assert answer.status_code == 200, answer.json()
    writes = [q["sql"] for q in queries if q["sql"].lstrip().split()[0].upper() in {"INSERT", "UPDATE", "DELETE"}]
    assert writes == []
    assert not Run.objects.exists()
    assert not Record.objects.filter(kind__startswith="docker.").exists()


def test_inputs_are_checked_as_a_start_checks_them(api: APIClient, demo: str) -> None:
    bad = plan(api, f"{demo}.env", {"inputs": {"replicas": 9, "colour": "red"}})
    assert bad.status_code == 400, bad.json()
    assert bad.json()["error"] == "validation_failed"
    assert set(bad.json()["fields"]) == {"inputs.replicas", "inputs.colour"}
    start = api.post(f"/api/v1/pipelines/{demo}.env/runs/", {"inputs": {"replicas": 9, "colour": "red"}}, format="json")
    assert start.json()["fields"] == bad.json()["fields"]  # the same errors as a start's
    unknown = plan(api, f"{demo}.env", {"inputs": {}, "revison": "abc1234"})
    assert unknown.status_code == 400
    assert set(unknown.json()["fields"]) == {"revison"}
    missing = plan(api, "no.such.pipeline")
    assert missing.status_code == 404
    assert missing.json()["error"] == "not_found"


def test_a_pipeline_that_raises_or_loops_is_a_422_saying_so(api: APIClient, demo: str, settings: Any) -> None:
    raised = plan(api, f"{demo}.env", {"inputs": {"mode": "raise"}})
    assert raised.status_code == 422, raised.json()
    assert raised.json()["error"] == "plan_failed"
    detail = raised.json()["detail"]
    assert detail.startswith("the pipeline raised RuntimeError: the pipeline refuses to plan\n")
    assert "plan_demo.py" in detail
    assert "Traceback" in detail
    settings.GRAPHENE_PLAN_TIMEOUT_SECONDS = 2
    looped = plan(api, f"{demo}.env", {"inputs": {"mode": "loop"}})
    assert looped.status_code == 422, looped.json()
    assert looped.json()["error"] == "plan_timeout"
    assert "longer than 2s (GRAPHENE_PLAN_TIMEOUT_SECONDS)" in looped.json()["detail"]
    assert not Run.objects.exists()


def test_a_branch_on_a_value_read_from_outside_stops_the_plan_there(api: APIClient, demo: str) -> None:
    answer = plan(api, f"{demo}.env", {"inputs": {"mode": "branch"}})
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert body["complete"] is False
    stopped = body["stopped"]
    assert stopped["placeholder"] == "<step migrate: result>"
    assert stopped["where"] == f"plan_demo.py:{BRANCH_LINE + 1}"
    assert "compares 'v2' with <step migrate: result>" in stopped["reason"]
    assert body["entries"][-1]["op"] == "to_stand"  # everything before the branch is there


def test_a_draft_revision_is_planned_as_it_would_start(api: APIClient, demo: str, tmp_path: Path) -> None:
    draft = push(api, _code(tmp_path, demo, replicas_default=3), activate=False)
    answer = plan(api, f"{demo}.env", {"revision": draft["digest"][:12]})
    assert answer.status_code == 200, answer.json()
    assert answer.json()["revision"] == draft["digest"]
    assert answer.json()["inputs"]["replicas"] == 3
    assert len(_by_op(answer.json()["entries"], "declare")) == 7  # three app containers now
    active = plan(api, f"{demo}.env").json()
    assert active["revision"] != draft["digest"]
    assert active["inputs"]["replicas"] == 2
    other = plan(api, "sample.tree", {"revision": draft["digest"][:12]})
    assert other.status_code == 404
    assert "defines no pipeline 'sample.tree'" in other.json()["detail"]


def test_code_installed_on_the_workers_is_planned_too(api: APIClient) -> None:
    answer = plan(api, "sample.tree", {"inputs": {"branches": 1, "leaves": 1}})
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert body["revision"] is None
    assert [(e["op"], e.get("ref") or e.get("target")) for e in body["entries"]] == [
        ("declare", "test.sleep branch-0"),
        ("declare", "test.sleep leaf-0-0"),
        ("ready", "test.sleep branch-0"),
        ("log", None),
        ("step", "step use-branch-0"),
    ]
    assert body["entries"][4]["args"] == ["<run: id>", "branch-0", 0]
    assert body["output"] == {"records": 2, "steps": ["<step use-branch-0: result>"]}


def test_a_viewer_may_plan_and_another_namespace_may_not(
    demo: str, viewer_api: APIClient, django_user_model: Any
) -> None:
    assert plan(viewer_api, f"{demo}.env").status_code == 200  # a plan does nothing: seeing is enough
    outsider = django_user_model.objects.create_user(username="olga", password="pw")
    factories.bind_namespace("team-z")
    factories.bind(outsider, "developer", "team-z")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {factories.api_token(outsider)}")
    refused = plan(client, f"{demo}.env")
    assert refused.status_code in (403, 404), refused.json()


@pytest.mark.django_db(transaction=True)
def test_the_sdk_client_plans_over_the_real_server_and_no_table_changes(
    web: WebServer, user: Any, api: APIClient, tmp_path: Path
) -> None:
    prefix = f"plan{uuid.uuid4().hex[:6]}"
    push(api, _code(tmp_path, prefix))
    client = Client(web.url, token=factories.api_token(user), ca_file=web.ca_file)
    client.plan(f"{prefix}.env")  # the server unpacks the revision once
    before = _row_counts()
    body = client.plan(f"{prefix}.env", {"replicas": 1})
    assert _row_counts() == before
    assert body["complete"] is True
    assert [e["name"] for e in body["entries"] if e["op"] == "declare"] == ["net", "db", "app-0", "builder", "probe"]
    with pytest.raises(ClientError) as refused:
        client.plan(f"{prefix}.env", {"replicas": "many"})
    assert refused.value.status == 400
    assert "inputs.replicas" in refused.value.fields


# Written by the workers' own liveness thread whenever it likes (a flush between tests removes
# their rows, and the next beat writes them again), and by each process's metrics flush at its
# interval (the plan's own request is counted there): not what a plan writes.
BACKGROUND = {"core_workerheartbeat", "observability_metrictotal"}


def _row_counts() -> dict[str, int]:
    with connection.cursor() as cursor:
        counts = {}
        for table in set(connection.introspection.table_names(cursor)) - BACKGROUND:
            cursor.execute(f'SELECT COUNT(*) FROM "{table}"')  # noqa: S608 - table names from the catalogue
            counts[table] = cursor.fetchone()[0]
    return counts
