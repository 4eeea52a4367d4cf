"""Pipeline delivery: a pushed directory becomes an immutable revision (described in a fresh
process, stored in the blob store), its pipelines are activated, every run records the
revision it started on and replays it on real workers, whatever is activated meanwhile; bad
code is refused with the reason and changes nothing."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from graphene_sdk import _delivery
from rest_framework.test import APIClient

from apps.artifacts import blobs
from apps.artifacts import services as artifacts
from apps.core.models import AuditEntry
from apps.pipelines import services
from apps.pipelines.models import Pipeline, PipelineEvent, Revision, Run
from tests.conftest import Worker, wait_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

CODE = """
from pydantic import BaseModel
from graphene_sdk import Context, pipeline

from .helpers import VERSION


class In(BaseModel):
    wait: float = 0


class Out(BaseModel):
    version: str


@pipeline("{name}", inputs=In)
def hold(ctx: Context, inputs: In) -> Out:
    {body}
    return Out(version=VERSION)
"""


def tree(base: Path, name: str, version: str, *, body: str = "pass", extra: dict[str, str] | None = None) -> Path:
    """A directory of pipeline code: ``name`` returns ``version`` after ``body``."""
    root = base / f"{name}-{version}-{uuid.uuid4().hex[:6]}"
    root.mkdir()
    (root / "hold.py").write_text(textwrap.dedent(CODE.format(name=name, body=body)))
    (root / "helpers.py").write_text(f"VERSION = {version!r}\n")
    for path, text in (extra or {}).items():
        (root / path).write_text(textwrap.dedent(text))
    return root


def post_archive(api: APIClient, url: str, data: bytes, content_type: str = "application/gzip") -> Any:
    return api.generic("POST", url, data, content_type=content_type)  # type: ignore[arg-type]  # bytes as they are


def push(api: APIClient, directory: Path, **params: str) -> Any:
    query = "&".join(f"{k}={v}" for k, v in {"namespace": "default", **params}.items())
    data = _delivery.pack(directory, max_bytes=50 * 1024**2)
    return post_archive(api, f"/api/v1/revisions/?{query}", data)


def outputs(run: Run, timeout: float = 60) -> Any:
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status in {"succeeded", "failed", "cancelled"},
        timeout=timeout,
        what=f"{run} to end",
    )
    run = Run.objects.get(pk=run.pk)
    assert run.status == "succeeded", run.error
    return run.outputs


def name() -> str:
    return f"deliv.{uuid.uuid4().hex[:8]}"


def test_a_push_makes_one_revision_per_content_and_activates_it(api: APIClient, user: Any, tmp_path: Path) -> None:
    pipeline = name()
    code = tree(tmp_path, pipeline, "A")
    answer = push(api, code)
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert body["created"] is True
    assert body["activated"] == [pipeline]
    assert body["pipelines"] == [pipeline]
    revision = Revision.objects.get(pk=body["id"])
    assert blobs.exists(revision.digest)  # the archive is in the blob store, by its digest
    (entry,) = revision.manifest["pipelines"]
    assert entry["input_schema"]["properties"]["wait"]["type"] == "number"
    assert entry["source"] == "hold:hold"
    assert Pipeline.objects.get(name=pipeline).revision == revision

    # The same files again (packed anew, in another directory): the same revision, nothing new.
    again = push(api, tree(tmp_path, pipeline, "A"))
    assert again.status_code == 200, again.json()
    assert again.json()["id"] == body["id"]
    assert again.json()["created"] is False
    assert Revision.objects.filter(digest=revision.digest).count() == 1

    shown = api.get(f"/api/v1/pipelines/{pipeline}/").json()
    assert shown["revision"] == revision.digest
    (event,) = api.get(f"/api/v1/pipelines/{pipeline}/events/").json()["results"]
    assert (event["reason"], event["actor"]) == ("Activated", "alice")
    assert AuditEntry.objects.filter(action="revision.create", object_id=str(revision.pk)).exists()
    assert api.get(f"/api/v1/revisions/{revision.digest[:10]}/").json()["digest"] == revision.digest
    listed = api.get(f"/api/v1/revisions/?pipeline={pipeline}").json()["results"]
    assert [r["id"] for r in listed] == [str(revision.pk)]
    # The orphan sweeper of the blob store knows the archive is held.
    assert artifacts.held_elsewhere([revision.digest]) == {revision.digest}

    # The Studio's pipeline page names the active revision and its delivery history.
    studio = Client()
    studio.force_login(user)
    page = studio.get(f"/pipelines/{pipeline}/").content.decode()
    assert f"revision {revision.short}" in page
    assert "Activated: revision" in page
    assert "by alice" in page


def test_a_run_replays_its_own_revision_while_new_runs_take_the_active_one(
    workers: list[Worker], api: APIClient, user: Any, tmp_path: Path
) -> None:
    pipeline = name()
    first = push(api, tree(tmp_path, pipeline, "A", body="if inputs.wait: ctx.sleep(inputs.wait)")).json()
    run = services.run_start(pipeline_name=pipeline, inputs={"wait": 8})
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "suspended", what=f"{run} to suspend in its sleep")

    # New code, activated while the run sleeps: its journal would not even match (no sleep).
    second = push(api, tree(tmp_path, pipeline, "B")).json()
    assert second["activated"] == [pipeline]
    assert Run.objects.get(pk=run.pk).status == "suspended", "the run woke before the new code was active"
    newer = services.run_start(pipeline_name=pipeline, inputs={})
    assert outputs(newer) == {"version": "B"}
    assert outputs(run) == {"version": "A"}  # it woke and finished on the code it started with
    assert Run.objects.get(pk=run.pk).revision_id == uuid.UUID(first["id"])
    assert Run.objects.get(pk=newer.pk).revision_id == uuid.UUID(second["id"])
    shown = api.get(f"/api/v1/runs/{run.pk}/").json()
    assert shown["revision"] == first["digest"]
    studio = Client()
    studio.force_login(user)
    assert f"revision {first['digest'][:12]}" in studio.get(f"/runs/{run.pk}/").content.decode()

    # A draft: started on a revision that is not active.
    draft = api.post(
        f"/api/v1/pipelines/{pipeline}/runs/", {"inputs": {}, "revision": first["digest"][:12]}, format="json"
    )
    assert draft.status_code == 201, draft.json()
    assert outputs(Run.objects.get(pk=draft.json()["id"])) == {"version": "A"}
    assert Pipeline.objects.get(name=pipeline).revision_id == uuid.UUID(second["id"])  # unchanged

    # Rollback: the older revision active again, recorded with who did it.
    rolled = api.post(f"/api/v1/pipelines/{pipeline}/activate/", {"revision": first["id"]}, format="json")
    assert rolled.status_code == 200, rolled.json()
    assert rolled.json()["revision"] == first["digest"]
    event = PipelineEvent.objects.filter(pipeline__name=pipeline).order_by("-id").first()
    assert event is not None
    assert (event.reason, event.actor.username if event.actor else None) == (
        "RolledBack",
        "alice",
    )
    assert outputs(services.run_start(pipeline_name=pipeline, inputs={})) == {"version": "A"}


def _refused(api: APIClient, directory: Path, *needles: str, **params: str) -> str:
    before = (Revision.objects.count(), list(Pipeline.objects.values_list("name", "revision")))
    answer = push(api, directory, **params)
    assert answer.status_code == 400, answer.json()
    body = answer.json()
    assert body["error"] == "revision_refused", body
    for needle in needles:
        assert needle in body["detail"], body["detail"]
    assert (Revision.objects.count(), list(Pipeline.objects.values_list("name", "revision"))) == before
    return str(body["detail"])


def test_code_that_cannot_be_a_revision_is_refused_with_the_reason_and_changes_nothing(
    api: APIClient, tmp_path: Path, settings: Any
) -> None:
    pipeline = name()
    assert push(api, tree(tmp_path, pipeline, "A")).status_code == 201
    active = Pipeline.objects.get(name=pipeline).revision_id

    broken = tree(tmp_path, pipeline, "B", extra={"hold.py": "def oops(:\n"})
    _refused(api, broken, "SyntaxError", "hold.py")
    missing = tree(
        tmp_path, pipeline, "C", extra={"more.py": "import no_such_distribution_here\nimport yaml_nope.sub\n"}
    )
    _refused(api, missing, "no_such_distribution_here", "yaml_nope", "not installed")
    sibling = tree(tmp_path, pipeline, "D", extra={"more.py": "import helpers\n"})
    _refused(api, sibling, "more.py:1", "from . import helpers")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.py").write_text("X = 1\n")
    _refused(api, empty, "no pipeline is defined")
    failing = tree(tmp_path, pipeline, "E", extra={"more.py": "raise RuntimeError('no config at import')\n"})
    trace = _refused(api, failing, "RuntimeError: no config at import")
    assert "Traceback" in trace
    assert "more.py" in trace
    invalid = tree(
        tmp_path,
        pipeline,
        "F",
        extra={
            "more.py": """
            import threading

            from pydantic import BaseModel, ConfigDict
            from graphene_sdk import pipeline

            class Odd(BaseModel):
                model_config = ConfigDict(arbitrary_types_allowed=True)
                lock: threading.Event

            @pipeline("deliv.odd-input", inputs=Odd)
            def odd(ctx, inputs):
                return None
            """
        },
    )
    _refused(api, invalid, "deliv.odd-input", "JSON Schema")
    installed = tree(tmp_path, "sample.noop", "G")
    _refused(api, installed, "sample.noop", "installed on the workers")
    elsewhere = tree(tmp_path, pipeline, "H", extra={"more.py": "from graphene_sdk import pipeline\n"})
    (elsewhere / "hold.py").write_text(
        (elsewhere / "hold.py").read_text().replace(f'"{pipeline}"', f'"{pipeline}", namespace="team-b"')
    )
    _refused(api, elsewhere, "names namespace 'team-b'", "delivered to namespace 'default'")
    slow = tree(
        tmp_path,
        pipeline,
        "I",
        extra={"more.py": "import threading\nthreading.Event().wait()  # an import that never ends\n"},
    )
    settings.GRAPHENE_REVISION_DESCRIBE_TIMEOUT_SECONDS = 2
    _refused(api, slow, "longer than 2s")
    settings.GRAPHENE_REVISION_MAX_BYTES = 4096
    big = tree(tmp_path, pipeline, "J", extra={"data.txt": "x" * 5000})
    answer = post_archive(api, "/api/v1/revisions/", _delivery.pack(big, max_bytes=10**6))
    assert answer.status_code == 400, answer.json()
    assert "4,096 bytes" in answer.json()["detail"]
    garbage = post_archive(api, "/api/v1/revisions/", b"not an archive")
    assert garbage.status_code == 400, garbage.json()
    assert "tar archive" in garbage.json()["detail"]
    assert Pipeline.objects.get(name=pipeline).revision_id == active  # still the first


def test_reading_revisions_needs_rights_and_pushing_needs_more(
    api: APIClient, viewer_api: APIClient, tmp_path: Path
) -> None:
    pipeline = name()
    denied = push(viewer_api, tree(tmp_path, pipeline, "A"))
    assert denied.status_code == 403, denied.json()
    assert not Revision.objects.exists()
    digest = push(api, tree(tmp_path, pipeline, "A")).json()["digest"]
    assert viewer_api.get(f"/api/v1/revisions/{digest}/").status_code == 200
    refused = viewer_api.post(f"/api/v1/pipelines/{pipeline}/activate/", {"revision": digest}, format="json")
    assert refused.status_code == 403, refused.json()
    elsewhere = push(api, tree(tmp_path, name(), "A"), namespace="team-b")
    assert elsewhere.status_code == 403, elsewhere.json()  # alice is bound in default only
