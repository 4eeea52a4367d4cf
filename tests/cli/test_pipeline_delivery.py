"""graphenectl delivers pipeline code: ``pipeline push`` makes a revision of a directory (the same
files again are the same revision), bad code is refused with its traceback and changes nothing,
``pipeline activate`` rolls back, ``pipeline revisions`` and ``history`` list what happened, and
``run start --revision`` runs a draft; listings show which revision pipelines and runs are on.

Against the shared web server (daphne, PostgreSQL), as a developer of the default namespace.
"""

from __future__ import annotations

import re
import shutil
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.pipelines.models import Pipeline, PipelineEvent, Revision, Run
from tests.conftest import Worker
from tests.factories import api_token
from tests.harness.embedded import Ctl, Result
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

CODE = """
from pydantic import BaseModel
from graphene_sdk import Context, pipeline

from .helpers import VERSION


class In(BaseModel):
    {fields}


class Out(BaseModel):
    version: str


@pipeline("{name}", inputs=In)
def hold(ctx: Context, inputs: In) -> Out:
    return Out(version=VERSION)
"""


@pytest.fixture
def ctl(web: WebServer, user: Any, tmp_path: Path) -> Ctl:
    """graphenectl for the shared web server as alice, a developer of the default namespace."""
    return Ctl(tmp_path / "config", **web.client_env(), GRAPHENE_TOKEN=api_token(user))


def code(base: Path, name: str, version: str, *, fields: str = "wait: float = 0") -> Path:
    """A directory of pipeline code: pipeline ``name`` returns ``version``."""
    root = base / f"{name}-{version}-{uuid.uuid4().hex[:6]}"
    root.mkdir()
    (root / "hold.py").write_text(textwrap.dedent(CODE.format(name=name, fields=fields)))
    (root / "helpers.py").write_text(f"VERSION = {version!r}\n")
    return root


def pushed(ctl: Ctl, directory: Path, *args: str) -> dict[str, Any]:
    body: dict[str, Any] = ctl.ok("pipeline", "push", str(directory), *args, "-o", "json").json()
    return body


def table(result: Result) -> list[list[str]]:
    return [line.split() for line in result.out.splitlines() if line.strip()]


def column(result: Result, header: str, first: str) -> str:
    """The cell under ``header`` in the row whose first cell is ``first``, by the header's
    offsets (a header may be two words: WAITING ON)."""
    head, *lines = result.out.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", head)]
    names = [m.group(0) for m in re.finditer(r"\S+(?: \S+)*", head)]
    at = names.index(header)
    end = starts[at + 1] if at + 1 < len(starts) else None
    for line in lines:
        if line.split()[0] == first:
            return line[starts[at] : end].strip()
    raise AssertionError(f"no row {first!r} in\n{result.out}")


def unique() -> str:
    return f"ctl.{uuid.uuid4().hex[:8]}"


def test_push_makes_a_revision_and_the_same_files_again_are_unchanged(ctl: Ctl, tmp_path: Path) -> None:
    name = unique()
    first = ctl.ok("pipeline", "push", str(code(tmp_path, name, "A")), "-n", "default")
    revision = Revision.objects.get()
    assert first.out.split() == [f"revision/{revision.digest}"]
    assert f"revision {revision.digest[:12]} created in namespace 'default'" in first.err
    assert f"pipelines: {name}" in first.err
    assert f"activated: {name}" in first.err
    assert Pipeline.objects.get(name=name).revision == revision

    # The same files from another directory: the same revision, nothing new, nothing activated.
    again = ctl.ok("pipeline", "push", str(code(tmp_path, name, "A")), "-o", "json")
    body = again.json()
    assert (body["digest"], body["id"], body["created"]) == (revision.digest, str(revision.pk), False)
    assert body["pipelines"] == [name]
    assert body["activated"] == []
    assert f"revision {revision.digest[:12]} unchanged" in again.err
    assert f"already active: {name}" in again.err
    assert Revision.objects.count() == 1

    # Pipelines show their active revision; code installed on the workers has none.
    pipelines = ctl.ok("get", "pipelines", "-n", "default")
    assert column(pipelines, "REVISION", name) == revision.digest[:12]
    assert column(pipelines, "REVISION", "sample.cli") == "-"
    # A revision is a resource of get and describe, by a digest prefix.
    assert ctl.ok("get", "revisions", revision.digest[:12], "-o", "json").json()["digest"] == revision.digest
    listed = ctl.ok("get", "revisions", "--pipeline", name, "-o", "name").out.split()
    assert listed == [f"revision/{revision.digest}"]
    described = ctl.ok("describe", f"revision/{revision.digest[:12]}").out
    assert revision.digest in described
    assert "hold:hold" in described  # the pipeline it defines, with its source
    assert "Modules:" in described
    assert "helpers, hold" in described


def test_a_refused_push_prints_the_traceback_and_changes_nothing(ctl: Ctl, tmp_path: Path) -> None:
    name = unique()
    broken = code(tmp_path, name, "A")
    (broken / "hold.py").write_text("def oops(:\n    pass\n")
    try:
        compile((broken / "hold.py").read_text(), "hold.py", "exec")
    except SyntaxError as exc:
        raised = f"SyntaxError: {exc.msg}"  # the last line of the import's traceback
    else:
        raise AssertionError("the module compiles")

    refused = ctl("pipeline", "push", str(broken))
    assert refused.code == 2, refused.err
    assert refused.out == ""
    assert "Traceback (most recent call last)" in refused.err
    assert "hold.py" in refused.err
    trace = refused.err[refused.err.index("Traceback") :].splitlines()
    assert raised in trace, refused.err
    last = refused.err.strip().splitlines()
    assert last[-2].startswith("graphenectl: error: the revision was refused: importing the code failed: SyntaxError")
    assert "nothing was stored or activated" in last[-1]
    assert not Revision.objects.exists()
    assert not Pipeline.objects.filter(name=name).exists()

    # A DIR that is not a directory is a usage error, before anything is sent.
    missing = ctl("pipeline", "push", str(tmp_path / "nowhere"))
    assert missing.code == 2
    assert "no such directory" in missing.err
    a_file = ctl("pipeline", "push", str(broken / "helpers.py"))
    assert a_file.code == 2
    assert "is not a directory" in a_file.err


def test_activate_rolls_back_and_revisions_and_history_show_it(ctl: Ctl, tmp_path: Path) -> None:
    name = unique()
    first = pushed(ctl, code(tmp_path, name, "A"))
    second = pushed(ctl, code(tmp_path, name, "B"))
    assert second["activated"] == [name]
    old, new = first["digest"][:12], second["digest"][:12]

    rolled = ctl.ok("pipeline", "activate", name, old)
    assert f"pipeline {name}: revision {new} → {old} (rolled back)" in rolled.err
    assert rolled.out.split() == [f"pipeline/{name}"]
    assert Pipeline.objects.get(name=name).revision_id == uuid.UUID(first["id"])
    again = ctl.ok("pipeline", "activate", name, f"revision/{first['digest']}", "-o", "json")
    assert "already active; nothing changed" in again.err
    assert again.json()["revision"] == first["digest"]
    unknown = ctl("pipeline", "activate", name, "0000000")
    assert unknown.code == 3, unknown.err
    assert PipelineEvent.objects.filter(pipeline__name=name).count() == 3  # two pushes, one rollback

    listed = ctl.ok("pipeline", "revisions", name, "-o", "json").json()
    assert [r["digest"] for r in listed] == [second["digest"], first["digest"]]  # newest first
    rows = table(ctl.ok("pipeline", "revisions", name, "-n", "default"))
    assert rows[0][:3] == ["ACTIVE", "DIGEST", "PIPELINES"]
    assert rows[1][:2] == [new, name]  # not active: its ACTIVE cell is empty
    assert rows[2][:2] == ["*", old]
    limited = ctl.ok("pipeline", "revisions", name, "--limit", "1", "-o", "json")
    assert [r["digest"] for r in limited.json()] == [second["digest"]]
    assert "more exist" in limited.err
    assert ctl.ok("pipeline", "revisions", "nothing.defines.this", "-o", "json").json() == []

    history = ctl.ok("pipeline", "history", name, "-o", "json").json()
    assert [(e["reason"], e["actor"]) for e in history] == [
        ("Activated", "alice"),
        ("Activated", "alice"),
        ("RolledBack", "alice"),
    ]
    assert history[-1]["message"] == f"revision {new} → {old}"
    shown = ctl.ok("pipeline", "history", name).out
    assert "RolledBack" in shown
    assert f"revision {new} → {old}" in shown
    assert ctl("pipeline", "history", "no.such.pipeline").code == 3

    # A pipeline only ever pushed as a draft gets its first active revision.
    other = unique()
    draft = pushed(ctl, code(tmp_path, other, "A"), "--no-activate")
    assert not Pipeline.objects.filter(name=other).exists()
    first_time = ctl.ok("pipeline", "activate", other, draft["digest"][:7])
    assert f"pipeline {other}: revision {draft['digest'][:12]} (its first active revision)" in first_time.err
    assert Pipeline.objects.get(name=other).revision_id == uuid.UUID(draft["id"])


def test_run_start_revision_starts_a_draft_checked_against_its_own_inputs(
    ctl: Ctl, api: APIClient, tmp_path: Path
) -> None:
    name = unique()
    active = pushed(ctl, code(tmp_path, name, "A"))
    draft_push = ctl.ok(
        "pipeline", "push", str(code(tmp_path, name, "B", fields="extra: str = 'x'")), "--no-activate", "-o", "json"
    )
    draft = draft_push.json()
    assert draft["activated"] == []
    assert "activated: none (--no-activate)" in draft_push.err
    assert f"--revision {draft['digest'][:12]}" in draft_push.err
    assert Pipeline.objects.get(name=name).revision_id == uuid.UUID(active["id"])

    # The draft's inputs are its own: `extra` is unknown to the active revision.
    refused = ctl("run", "start", name, "-i", "extra=y")
    assert refused.code == 2
    assert "extra: unknown input" in refused.err
    started = ctl.ok("run", "start", name, "--revision", draft["digest"][:12], "-i", "extra=y", "-o", "json")
    run = started.json()
    assert run["revision"] == draft["digest"]
    assert f"(queued) on revision {draft['digest'][:12]}: run/{run['id']}" in started.err
    over_rest = api.get(f"/api/v1/runs/{run['id']}/").json()
    assert (over_rest.get("run") or over_rest)["revision"] == draft["digest"]
    assert Run.objects.get(pk=run["id"]).inputs == {"extra": "y"}
    assert Pipeline.objects.get(name=name).revision_id == uuid.UUID(active["id"])  # still the active one

    # Listings show each run's revision.
    normal = ctl.ok("run", "start", name, "-o", "json").json()
    assert normal["revision"] == active["digest"]
    runs = ctl.ok("run", "list", "--pipeline", name, "-n", "default", "-o", "wide")
    assert column(runs, "REVISION", run["id"]) == draft["digest"][:12]
    assert column(runs, "REVISION", normal["id"]) == active["digest"][:12]
    described = ctl.ok("describe", f"run/{run['id']}").out
    assert any(line.split() == ["Revision:", draft["digest"][:12]] for line in described.splitlines()), described

    # A revision that does not define the pipeline: refused before anything is sent.
    elsewhere = ctl("run", "start", "sample.cli", "--revision", draft["digest"][:12])
    assert elsewhere.code == 2
    assert f"defines no pipeline 'sample.cli'; it defines: {name}" in elsewhere.err


def test_a_draft_run_executes_its_revision_while_another_is_active(
    ctl: Ctl, workers: list[Worker], tmp_path: Path
) -> None:
    name = unique()
    older = pushed(ctl, code(tmp_path, name, "A"))
    pushed(ctl, code(tmp_path, name, "B"))
    watched = ctl.ok("run", "start", name, "--revision", older["digest"][:12], "--watch", "-o", "json")
    assert watched.json()["status"] == "succeeded"
    assert watched.json()["outputs"] == {"version": "A"}
    # In a log (not a terminal), the watch says once which code runs.
    assert f"run {name} #1 revision {older['digest'][:12]}: " in watched.err
    assert ctl.ok("run", "start", name, "--watch", "-o", "json").json()["outputs"] == {"version": "B"}


def test_a_pushed_tree_leaves_out_caches_and_version_control(ctl: Ctl, tmp_path: Path) -> None:
    name = unique()
    clean = code(tmp_path, name, "A")
    cluttered = tmp_path / "cluttered"
    shutil.copytree(clean, cluttered)
    (cluttered / "__pycache__").mkdir()
    (cluttered / "__pycache__" / "hold.cpython-312.pyc").write_bytes(b"\0junk")
    (cluttered / ".git").mkdir()
    (cluttered / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    assert pushed(ctl, clean)["digest"] == pushed(ctl, cluttered)["digest"]
