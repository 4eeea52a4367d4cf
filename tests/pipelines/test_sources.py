"""Git sources: a repository at a ref delivers pipeline code. A sync makes a revision of each new
commit and activates it, and runs started afterwards run the new code; a sync of the same
commit asks the repository once and changes nothing; a sync that cannot make a revision
records why on the source, answers it, and leaves the active revisions as they were.

Real repositories behind ``git daemon`` and git's smart HTTP with Basic auth (tests/git/servers.py),
real workers, the REST API, and graphenectl against the shared web server.
"""

from __future__ import annotations

import logging
import re
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from apps.core.models import AuditEntry
from apps.pipelines import services
from apps.pipelines.delivery import gitsource
from apps.pipelines.models import Pipeline, Revision, Run, Source
from apps.secrets.services import secret_create, secret_delete
from kinds.git.cli import DEFAULT_USERNAME
from tests import factories
from tests.agents.test_ssh_install import tables_containing
from tests.conftest import Worker, wait_for
from tests.git import conftest as git_fixtures
from tests.git.servers import GitDaemon, GitHTTP, Upstream
from tests.harness.embedded import Ctl, Result
from tests.harness.net import free_port
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

# The git tests' servers and upstream repositories.
served = git_fixtures.served
daemon = git_fixtures.daemon
upstream = git_fixtures.upstream

TOKEN = "src-tok-" + uuid.uuid4().hex  # the one token the HTTP server takes; must never travel
WRONG = "src-wrong-" + uuid.uuid4().hex  # a token it refuses; must never travel either

HOLD = '''
from pydantic import BaseModel
from graphene_sdk import Context, pipeline

from .helpers import VERSION


class In(BaseModel):
    pass


class Out(BaseModel):
    version: str


@pipeline("{name}", inputs=In)
def hold(ctx: Context, inputs: In) -> Out:
    """Says which version of the code it is."""
    return Out(version=VERSION)
'''


@pytest.fixture(scope="module")
def private_git(served: Path) -> Iterator[GitHTTP]:
    """Smart HTTP that takes the username git sends with a source's token (``x-access-token``)."""
    server = GitHTTP(served, DEFAULT_USERNAME, TOKEN).start()
    yield server
    server.stop()


@pytest.fixture
def private(private_git: GitHTTP) -> Iterator[GitHTTP]:
    """The HTTP server, its request log emptied; no command line showed a token meanwhile."""
    private_git.requests.clear()
    private_git.leaks.clear()
    private_git.clients_seen.clear()
    yield private_git
    assert private_git.leaks == []
    assert private_git.clients_seen  # it looked while git was talking to it
    assert not [line for line in private_git.clients_seen if WRONG in line]


def pipeline_name() -> str:
    return f"src.{uuid.uuid4().hex[:8]}"


def code(name: str, version: str, where: str = "ci") -> dict[str, str]:
    """The files of a pipeline ``name`` that returns ``version``, under ``where``."""
    return {
        f"{where}/hold.py": textwrap.dedent(HOLD.replace("{name}", name)),
        f"{where}/helpers.py": f"VERSION = {version!r}\n",
    }


def apply(api: APIClient, **body: Any) -> Any:
    namespace = body.pop("namespace", "default")
    return api.post(f"/api/v1/sources/?namespace={namespace}", {"name": "app", **body}, format="json")


def sync(api: APIClient, name: str = "app", namespace: str = "default") -> Any:
    return api.post(f"/api/v1/sources/{name}/sync/?namespace={namespace}")


def shown(api: APIClient, name: str = "app") -> dict[str, Any]:
    answer = api.get(f"/api/v1/sources/{name}/?namespace=default")
    assert answer.status_code == 200, answer.json()
    body: dict[str, Any] = answer.json()
    return body


def synced(api: APIClient, name: str = "app") -> dict[str, Any]:
    answer = sync(api, name)
    assert answer.status_code == 200, answer.json()
    body: dict[str, Any] = answer.json()
    return body


def git_revisions() -> Any:
    """Revisions synced from git (the example directories' local source delivers revisions of
    its own whenever a pipeline is looked up)."""
    return Revision.objects.filter(source__isnull=False).exclude(source__url="")


def outputs(run: Run, timeout: float = 60) -> Any:
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status in {"succeeded", "failed", "cancelled"},
        timeout=timeout,
        what=f"{run} to end",
    )
    run = Run.objects.get(pk=run.pk)
    assert run.status == "succeeded", run.error
    return run.outputs


# --- syncing ------------------------------------------------------------------------------------


def test_each_new_commit_synced_is_a_revision_that_new_runs_take(
    workers: list[Worker], api: APIClient, daemon: GitDaemon, upstream: Upstream
) -> None:
    pipeline = pipeline_name()
    first = upstream.commit("pipeline A", code(pipeline, "A"))
    made = apply(api, url=daemon.url(upstream), ref="main", subdirectory="ci")
    assert made.status_code == 201, made.json()
    assert made.json()["commit"] == ""
    assert made.json()["revision"] is None
    assert not git_revisions().exists()  # applying fetches nothing

    one = synced(api)
    assert (one["commit"], one["new"], one["revision_created"]) == (first, True, True)
    assert one["activated"] == [pipeline]
    assert one["pipelines"] == [pipeline]
    assert one["error"] == ""
    assert one["synced_at"] is not None
    revision = Revision.objects.get(digest=one["revision"])
    assert (revision.source.name if revision.source else None, revision.commit) == ("app", first)
    assert Pipeline.objects.get(name=pipeline).revision == revision
    listed = api.get(f"/api/v1/revisions/?pipeline={pipeline}").json()["results"]
    assert [(r["digest"], r["source"], r["commit"]) for r in listed] == [(revision.digest, "app", first)]
    assert outputs(services.run_start(pipeline_name=pipeline, inputs={})) == {"version": "A"}
    # The Studio's pipelines page lists the source, its commit and its revision.
    studio = Client()
    studio.force_login(User.objects.get(username="alice"))
    page = studio.get("/pipelines/").content.decode()
    assert 'data-source="default/app"' in page
    assert first[:12] in page
    assert revision.short in page

    # The same commit again: nothing new, nothing activated, the same revision.
    again = synced(api)
    assert (again["new"], again["activated"], again["revision"], again["commit"]) == (False, [], one["revision"], first)
    assert git_revisions().count() == 1

    # A new commit upstream: a new revision, active at once; runs started now run it.
    second = upstream.commit("pipeline B", code(pipeline, "B"))
    two = synced(api)
    assert (two["commit"], two["new"], two["revision_created"], two["activated"]) == (second, True, True, [pipeline])
    assert two["revision"] != one["revision"]
    assert Pipeline.objects.get(name=pipeline).revision.digest == two["revision"]  # type: ignore[union-attr]
    assert outputs(services.run_start(pipeline_name=pipeline, inputs={})) == {"version": "B"}
    assert shown(api)["revision"] == two["revision"]

    # A commit that changes nothing under the sub-directory: the same files, the same revision.
    third = upstream.commit("docs only", {"README": "docs moved on\n"})
    same = synced(api)
    assert (same["commit"], same["new"], same["revision_created"], same["activated"]) == (third, True, False, [])
    assert same["revision"] == two["revision"]

    actions = list(AuditEntry.objects.filter(resource="sources").order_by("id").values_list("action", flat=True))
    assert actions == ["source.create"] + ["source.sync"] * 4


def test_a_source_that_does_not_activate_makes_drafts_until_it_does(
    api: APIClient, daemon: GitDaemon, upstream: Upstream
) -> None:
    pipeline = pipeline_name()
    upstream.commit("pipeline A", code(pipeline, "A"))
    assert apply(api, url=daemon.url(upstream), ref="main", subdirectory="ci", activate=False).status_code == 201
    draft = synced(api)
    assert (draft["new"], draft["activated"], draft["activate"]) == (True, [], False)
    assert not Pipeline.objects.filter(name=pipeline).exists()
    # Turned on: the next sync activates the revision it has, though the commit is the same.
    changed = apply(api, url=daemon.url(upstream), ref="main", subdirectory="ci", activate=True)
    assert changed.status_code == 200, changed.json()
    now = synced(api)
    assert (now["activated"], now["revision"], now["revision_created"]) == ([pipeline], draft["revision"], False)
    assert Pipeline.objects.get(name=pipeline).revision.digest == draft["revision"]  # type: ignore[union-attr]


def test_an_unchanged_commit_costs_one_ls_remote_and_the_token_goes_nowhere(
    api: APIClient, private: GitHTTP, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    pipeline = pipeline_name()
    upstream.commit("pipeline A", code(pipeline, "A"))
    secret_create(name="git-token", value=TOKEN + "\n")  # as `secret set` stores a file's line
    made = apply(api, url=private.url(upstream), ref="main", subdirectory="ci", credential="git-token")
    assert made.status_code == 201, made.json()
    first = synced(api)
    assert first["activated"] == [pipeline]
    assert first["credential"] == "git-token"
    assert any(authorized for _, _, authorized in private.requests)

    private.requests.clear()
    again = synced(api)
    assert again["new"] is False
    during_sync = list(private.requests)
    private.requests.clear()
    gitsource.resolve(private.url(upstream), "main", gitsource.token_credentials(TOKEN))
    assert during_sync == private.requests  # exactly what one ls-remote asks, and no fetch

    bodies = str(first) + str(again) + str(shown(api))
    assert TOKEN not in bodies
    assert tables_containing(TOKEN) == []  # the secret's value is encrypted at rest; nothing else holds it
    assert TOKEN not in caplog.text


def test_a_sync_that_fails_says_why_on_the_source_and_in_the_answer_and_changes_nothing(
    api: APIClient, daemon: GitDaemon, private: GitHTTP, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    pipeline = pipeline_name()
    good = upstream.commit("pipeline A", code(pipeline, "A"))
    url = daemon.url(upstream)
    assert apply(api, url=url, ref="main", subdirectory="ci").status_code == 201
    first = synced(api)
    assert first["commit"] == good
    active = first["revision"]
    revisions = git_revisions().count()

    def refused(code_: str, *needles: str, name: str = "app") -> dict[str, Any]:
        before = shown(api, name)
        answer = sync(api, name)
        assert answer.status_code == 400, answer.json()
        body: dict[str, Any] = answer.json()
        assert body["error"] == code_, body
        assert "keep their active revisions" in body["detail"], body
        source = shown(api, name)
        for needle in needles:
            assert needle in body["detail"], body["detail"]
            assert needle in source["error"], source["error"]
        assert source["error_at"] is not None
        assert Pipeline.objects.get(name=pipeline).revision.digest == active  # type: ignore[union-attr]
        assert git_revisions().count() == revisions
        assert (source["commit"], source["revision"]) == (before["commit"], before["revision"])
        return source

    def change(**settings: Any) -> None:
        answer = api.patch("/api/v1/sources/app/?namespace=default", settings, format="json")
        assert answer.status_code == 200, answer.json()

    # Unreachable: nothing listens there; no such repository on the server.
    nowhere = f"git://127.0.0.1:{free_port()}/app.git"
    change(url=nowhere)
    refused("unreachable", f"the repository {nowhere} cannot be reached")
    missing = url.replace(upstream.name, "no-such-repo.git")
    change(url=missing)
    refused("unreachable", f"there is no git repository at {missing}")
    change(url=url)

    # A ref the repository does not have: the message lists those it has.
    change(ref="release")
    refused("ref_not_found", "the ref 'release' was not found", "Branches: feature, main.")
    change(ref="main")

    # A tree that defines no pipeline, then code that does not even parse.
    upstream.commit("no pipeline", {"ci/hold.py": "X = 1\n"})
    refused("revision_refused", "no pipeline is defined")
    upstream.commit("broken", {"ci/hold.py": "def oops(:\n"})
    refused("revision_refused", "SyntaxError", "hold.py")

    # A sub-directory the commit does not have.
    change(subdirectory="nope")
    refused("subdirectory_not_found", "the sub-directory 'nope' does not exist")
    change(subdirectory="ci")

    # Fixed upstream: the next sync works and clears the error.
    fixed = upstream.commit("pipeline C", code(pipeline, "C"))
    after = synced(api)
    assert (after["commit"], after["error"], after["error_at"]) == (fixed, "", None)
    assert after["activated"] == [pipeline]

    # A private repository: no credential, a credential the server refuses, a secret gone.
    secret_create(name="wrong-token", value=WRONG)
    made = apply(api, name="private", url=private.url(upstream), ref="main", subdirectory="ci")
    assert made.status_code == 201, made.json()
    active = after["revision"]
    revisions = git_revisions().count()
    refused("credential_required", "asks for a credential and none was given", name="private")
    change_private = api.patch(
        "/api/v1/sources/private/?namespace=default", {"credential": "wrong-token"}, format="json"
    )
    assert change_private.status_code == 200, change_private.json()
    source = refused("credential_refused", "the server refused the credential", name="private")
    assert source["revision"] is None
    secret_delete(name="wrong-token")
    refused("secret_not_found", "secret 'wrong-token' does not exist", name="private")
    assert any(not authorized for _, _, authorized in private.requests)
    assert not any(authorized for _, _, authorized in private.requests)  # the wrong token opened nothing

    # Every refusal is in the audit trail; no token went anywhere.
    failed = AuditEntry.objects.filter(resource="sources", action="source.sync", detail__has_key="failed")
    assert failed.count() == 9
    assert tables_containing(WRONG) == []
    assert WRONG not in caplog.text


# --- settings, rights, the other verbs ------------------------------------------------------------


def test_settings_are_checked_before_anything_is_stored(api: APIClient) -> None:
    secret_create(name="git-token", value="t")
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"url": "github.com/org/app"}, "url", "is not a URL with a scheme"),
        ({"url": "ftp://example.invalid/app.git"}, "url", "the scheme 'ftp' is not one of"),
        ({"url": "https://bob:hunter2@example.invalid/app.git"}, "url", "carries credentials"),
        ({"url": "https://example.invalid/a pp.git"}, "url", "whitespace"),
        ({"ref": ""}, "ref", ""),
        ({"ref": "-x"}, "ref", "starts with '-'"),
        ({"ref": "main "}, "ref", "whitespace"),
        ({"subdirectory": "../up"}, "subdirectory", "contains '..'"),
        ({"subdirectory": "/abs"}, "subdirectory", "is absolute"),
        ({"credential": "git-token", "url": "git://example.invalid/app.git"}, "credential", "http(s)"),
        ({"credential": "no-such-secret"}, "credential", "no secret 'no-such-secret' in namespace 'default'"),
        ({"credential": "bad/name"}, "credential", "the name of a secret"),
        ({"name": "Bad_Name"}, "name", "is not a valid name"),
        ({"subdir": "ci"}, "subdir", "unknown field"),
        ({"activate": "maybe"}, "activate", ""),
    ]
    for change, field, needle in cases:
        body = {"url": "https://example.invalid/org/app.git", "ref": "main", **change}
        answer = apply(api, **body)
        assert answer.status_code == 400, (change, answer.json())
        assert field in answer.json()["fields"], (change, answer.json())
        assert needle in answer.json()["detail"], (change, answer.json())
        assert "hunter2" not in str(answer.json())
    assert not Source.objects.exists()
    assert not AuditEntry.objects.filter(resource="sources").exists()
    # A namespace that does not exist, and one the developer has no role in.
    assert apply(api, url="https://example.invalid/a.git", ref="main", namespace="nowhere").status_code in (403, 404)


def test_a_source_is_read_by_viewers_and_changed_by_developers_with_an_audit_trail(
    api: APIClient, viewer_api: APIClient
) -> None:
    url = "https://example.invalid/org/app.git"
    put = api.put("/api/v1/sources/app/?namespace=default", {"url": url, "ref": "main"}, format="json")
    assert put.status_code == 201, put.json()
    assert (put.json()["subdirectory"], put.json()["credential"], put.json()["activate"]) == ("", "", True)
    assert put.json()["created_by"] == "alice"
    same = api.put("/api/v1/sources/app/?namespace=default", {"url": url, "ref": "main"}, format="json")
    assert same.status_code == 200, same.json()
    patched = api.patch("/api/v1/sources/app/?namespace=default", {"ref": "v2"}, format="json")
    assert (patched.status_code, patched.json()["ref"], patched.json()["url"]) == (200, "v2", url)

    listed = viewer_api.get("/api/v1/sources/?namespace=default")
    assert listed.status_code == 200, listed.json()
    assert [s["name"] for s in listed.json()["results"]] == ["app"]
    assert viewer_api.get("/api/v1/sources/app/?namespace=default").json()["ref"] == "v2"
    for method, path in [
        ("post", "/api/v1/sources/?namespace=default"),
        ("put", "/api/v1/sources/app/?namespace=default"),
        ("patch", "/api/v1/sources/app/?namespace=default"),
        ("post", "/api/v1/sources/app/sync/?namespace=default"),
        ("delete", "/api/v1/sources/app/?namespace=default"),
    ]:
        answer = getattr(viewer_api, method)(path, {"name": "app", "url": url, "ref": "x"}, format="json")
        assert answer.status_code == 403, (method, path, answer.json())
    assert Source.objects.get(name="app").ref == "v2"

    assert api.delete("/api/v1/sources/app/?namespace=default").status_code == 204
    assert api.get("/api/v1/sources/app/?namespace=default").status_code == 404
    assert api.post("/api/v1/sources/app/sync/?namespace=default").status_code == 404
    actions = list(AuditEntry.objects.filter(resource="sources").order_by("id").values_list("action", flat=True))
    assert actions == ["source.create", "source.update", "source.delete"]  # an unchanged apply writes nothing
    # A source without a repository (pushed directories) has nothing to sync.
    Source.objects.create(name="pushed", namespace="default")
    answer = api.post("/api/v1/sources/pushed/sync/?namespace=default")
    assert (answer.status_code, answer.json()["error"]) == (400, "no_repository")


# --- graphenectl --------------------------------------------------------------------------------


@pytest.fixture
def ctl(web: WebServer, django_user_model: Any, tmp_path: Path) -> Ctl:
    """graphenectl as a developer of the default namespace, against the shared web server."""
    dev = django_user_model.objects.create_user(username="dana", password="pw")
    factories.bind(dev, "developer")
    return Ctl(tmp_path / "config", **web.client_env(), GRAPHENE_TOKEN=factories.api_token(dev))


def lines(result: Result) -> dict[str, str]:
    """``key: value`` lines of stdout."""
    return dict(line.split(": ", 1) for line in result.out.splitlines() if ": " in line)


def test_graphenectl_applies_lists_syncs_and_deletes_a_source(ctl: Ctl, daemon: GitDaemon, upstream: Upstream) -> None:
    pipeline = pipeline_name()
    first = upstream.commit("pipeline A", code(pipeline, "A"))
    url = daemon.url(upstream)
    made = ctl.ok("source", "apply", "app", "--url", url, "--ref", "main", "--subdirectory", "ci")
    assert made.out == "source/app\n"
    assert "source/app created in namespace 'default'" in made.err
    assert "graphenectl source sync app" in made.err

    listed = ctl.ok("source", "list", "-n", "default")
    header, row = listed.out.splitlines()
    assert header.split() == ["NAME", "URL", "REF", "COMMIT", "REVISION", "SYNCED", "STATUS"]
    assert row.split() == ["app", url, "main", "-", "-", "-", "-"]
    assert [s["name"] for s in ctl.ok("source", "list", "-A", "-o", "json").json()] == ["app"]
    assert ctl.ok("source", "list", "-o", "name").out == "source/app\n"

    one = ctl.ok("source", "sync", "app")
    said = lines(one)
    revision = Revision.objects.get(commit=first)
    assert (said["commit"], said["revision"], said["new"]) == (first, revision.digest, "yes")
    assert said["activated"] == pipeline
    assert f"commit {first[:12]} is a new revision" in one.err
    again = lines(ctl.ok("source", "sync", "app"))
    assert again["new"].startswith("no")
    assert (again["revision"], again["activated"]) == (revision.digest, "none")
    as_json = ctl.ok("source", "sync", "app", "-o", "json").json()
    assert (as_json["new"], as_json["revision"]) == (False, revision.digest)

    described = ctl.ok("source", "get", "app").out
    assert re.search(rf"^Commit:\s+{first}$", described, re.M), described
    assert re.search(rf"^Revision:\s+{revision.digest}$", described, re.M), described
    assert "Error" not in described

    # A refusal: the error, exit 1, and it stays on the source for `source get`.
    assert "configured" in ctl.ok("source", "apply", "app", "--url", url, "--ref", "nope", "--subdirectory", "ci").err
    failed = ctl("source", "sync", "app")
    assert failed.code == 1, failed
    assert "graphenectl: error: source 'app' was not synced" in failed.err
    assert "the ref 'nope' was not found" in failed.err
    assert "Traceback" not in failed.err
    assert failed.out == ""
    assert "the ref 'nope' was not found" in ctl.ok("source", "get", "app").out
    assert ctl.ok("source", "get", "app", "-o", "json").json()["error"].startswith("the ref 'nope'")
    assert Pipeline.objects.get(name=pipeline).revision == revision

    bad = ctl("source", "apply", "app", "--url", "example.invalid/app", "--ref", "main")
    assert bad.code == 2, bad
    assert "is not a URL with a scheme" in bad.err

    assert "source/app deleted" in ctl.ok("source", "delete", "app").err
    assert ctl("source", "get", "app").code == 3
    assert Revision.objects.filter(pk=revision.pk, source__isnull=True).exists()  # revisions stay
