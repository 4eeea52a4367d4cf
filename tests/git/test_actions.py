"""The git actions behind ``graphene_sdk.libs.git``: ls-remote, tag and commit with push.

They run where a step runs (the worker) and are called here directly; the pipeline test runs
them through ``ctx.step``. Each must converge when repeated (a step is at least once).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.records.choices import Phase
from apps.secrets.services import secret_create
from kinds.git import actions
from kinds.git.cli import GitError
from tests.agents.test_ssh_install import tables_containing
from tests.git.conftest import HTTP_TOKEN, HTTP_USER, declare
from tests.git.servers import GitDaemon, GitHTTP, Upstream, git

pytestmark = pytest.mark.django_db


def test_ls_remote_lists_every_ref(daemon: GitDaemon, upstream: Upstream) -> None:
    refs = actions.ls_remote(daemon.url(upstream))
    assert refs["HEAD"] == upstream.shas["second"]
    assert refs["refs/heads/main"] == upstream.shas["second"]
    assert refs["refs/heads/feature"] == upstream.shas["feature"]
    assert refs["refs/tags/v1"] == upstream.shas["first"]
    assert refs["refs/tags/v2.0^{}"] == upstream.shas["second"]  # the annotated tag, peeled
    assert refs["refs/tags/v2.0"] != upstream.shas["second"]  # ... and the tag object itself
    assert actions.ls_remote(upstream.file_url()) == refs
    with pytest.raises(GitError) as refused:
        actions.ls_remote("https://me:hunter2@example.com/a.git")
    assert "hunter2" not in str(refused.value)


def test_commit_and_tag_push_to_git_daemon_and_converge_when_repeated(
    eager: None, django_capture_on_commit_callbacks: Any, daemon: GitDaemon, upstream: Upstream
) -> None:
    record = declare(django_capture_on_commit_callbacks, "src", repository=daemon.url(upstream), ref="main")
    assert record.phase == Phase.READY, record.last_error
    path = Path(record.outputs["path"])
    (path / "VERSION").write_text("3\n")
    (path / "scratch.txt").write_text("not to be committed\n")

    done = actions.commit(str(path), "version 3", paths=["VERSION"])
    assert done["committed"] is True
    assert done["pushed"] is True
    assert done["branch"] == "main"
    assert upstream.ref("refs/heads/main") == done["commit"]
    assert git("show", "--name-only", "--format=%s", done["commit"], cwd=upstream.bare).split() == [
        "version",
        "3",
        "VERSION",
    ]
    again = actions.commit(str(path), "version 3", paths=["VERSION"])  # a re-run after a crash
    assert again == {**done, "committed": False}
    assert upstream.ref("refs/heads/main") == done["commit"]

    tagged = actions.tag(str(path), "v3", message="release 3")
    assert tagged == {"tag": "v3", "commit": done["commit"], "pushed": True}
    assert upstream.ref("refs/tags/v3") == done["commit"]
    assert git("cat-file", "-t", "refs/tags/v3", cwd=upstream.bare) == "tag"  # annotated
    assert actions.tag(str(path), "v3", message="release 3") == tagged  # exists on HEAD: kept
    with pytest.raises(GitError, match="already exists"):
        actions.tag(str(path), "v1")  # exists on another commit: tags are not moved
    local = actions.tag(str(path), "local-only", push=False)
    assert local["pushed"] is False
    assert "refs/tags/local-only" not in actions.ls_remote(daemon.url(upstream))


def test_commit_on_a_detached_checkout_needs_a_branch(
    eager: None, django_capture_on_commit_callbacks: Any, daemon: GitDaemon, upstream: Upstream
) -> None:
    record = declare(django_capture_on_commit_callbacks, "tag", repository=daemon.url(upstream), ref="v1")
    path = Path(record.outputs["path"])
    (path / "HOTFIX").write_text("1\n")
    with pytest.raises(GitError, match="not on a branch"):
        actions.commit(str(path), "hotfix")
    done = actions.commit(str(path), "hotfix", branch="hotfix-1")
    assert done["committed"] is False, "committed by the first call, pushed by this one"
    assert upstream.ref("refs/heads/hotfix-1") == done["commit"]
    with pytest.raises(GitError, match="not a git checkout"):
        actions.commit(str(path / "src"), "nowhere")


def test_actions_over_http_with_a_secret(
    eager: None, django_capture_on_commit_callbacks: Any, http_git: GitHTTP, upstream: Upstream
) -> None:
    secret_create(name="git-token", value=HTTP_TOKEN)
    http_git.leaks.clear()
    refs = actions.ls_remote(http_git.url(upstream), "git-token", HTTP_USER)
    assert refs["refs/heads/main"] == upstream.shas["second"]
    with pytest.raises(GitError, match="terminal prompts disabled"):
        actions.ls_remote(http_git.url(upstream))
    record = declare(
        django_capture_on_commit_callbacks,
        "src",
        repository=http_git.url(upstream),
        ref="main",
        auth={"$secret": "git-token"},
        username=HTTP_USER,
    )
    path = Path(record.outputs["path"])
    (path / "VERSION").write_text("4\n")
    with pytest.raises(GitError, match="terminal prompts disabled"):
        actions.commit(str(path), "version 4")  # committed, but the push needs the token
    done = actions.commit(str(path), "version 4", auth="git-token", username=HTTP_USER)
    assert done["pushed"] is True
    assert upstream.ref("refs/heads/main") == done["commit"]
    actions.tag(str(path), "v4", auth="git-token", username=HTTP_USER)
    assert upstream.ref("refs/tags/v4") == done["commit"]
    assert http_git.leaks == []
    assert tables_containing(HTTP_TOKEN) == []
