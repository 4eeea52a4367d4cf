"""A real run (a Celery worker process) declaring a checkout through ``graphene_sdk.libs.git``,
reading a file from it in a step, and committing, tagging and pushing over authenticated HTTP."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from graphene_sdk.libs import git as gitlib
from graphene_sdk.testing import World

from apps.pipelines import services
from apps.pipelines.choices import TERMINAL, RunStatus
from apps.pipelines.models import JournalEntry, Run
from apps.records.choices import Phase
from apps.records.models import Record
from apps.secrets.services import secret_create
from tests.agents.test_ssh_install import files_containing, tables_containing
from tests.conftest import Worker, wait_for
from tests.git import pipelines
from tests.git.conftest import HTTP_TOKEN, HTTP_USER
from tests.git.servers import GitHTTP, Upstream


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_a_run_checks_out_reads_commits_tags_and_cleans_up(
    workers: list[Worker], http_git: GitHTTP, upstream: Upstream
) -> None:
    secret_create(name="git-token", value=HTTP_TOKEN)
    http_git.leaks.clear()

    run = services.run_start(
        pipeline_name="git.release",
        inputs={"repository": http_git.url(upstream), "secret": "git-token", "username": HTTP_USER},
    )
    wait_for(lambda: Run.objects.get(pk=run.pk).status in TERMINAL, timeout=180, what="the run to end")
    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.SUCCEEDED, run.error
    out = run.outputs or {}
    assert out["readme"] == "version 2\n"
    assert out["checkout"]["commit"] == upstream.shas["second"]
    assert out["heads"] == ["refs/heads/feature", "refs/heads/main"]
    assert upstream.ref("refs/heads/main") == out["commit"]["commit"] != upstream.shas["second"]
    assert upstream.ref("refs/tags/v9") == out["commit"]["commit"]

    calls = list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("call", flat=True))
    assert [c for c in calls if c.startswith(("declare ", "step "))] == [
        "declare git.checkout/src",
        "step read README",
        "step git.ls_remote",
        "step write VERSION",
        "step git.commit",
        "step git.tag v9",
    ]
    checkout = Record.objects.get(created_by_run_id=run.record_id, kind="git.checkout")
    assert checkout.spec["auth"] == {"$secret": "git-token"}
    # The run ended: its checkout was deleted with it, directory included.
    wait_for(
        lambda: Record.objects.get(pk=checkout.pk).phase == Phase.DELETED, timeout=60, what="the checkout's deletion"
    )
    assert not Path(out["checkout"]["path"]).exists()
    # The token went nowhere: no process's command line, no table, no worker log.
    assert http_git.leaks == []
    assert tables_containing(HTTP_TOKEN) == []
    assert files_containing(HTTP_TOKEN, *(worker.log for worker in workers)) == []


def test_the_library_declares_names_and_journals_in_the_testing_world(upstream: Upstream) -> None:
    world = World()
    result = world.run(pipelines.release, {"repository": upstream.file_url(), "secret": "tok", "username": "me"})
    # The world simulates records generically (no checkout on disk), so the step that reads
    # from it fails; the declaration before it is what the library built.
    assert result.status == "failed"
    spec = world.record("src", include_deleted=True).spec
    assert spec == {
        "repository": upstream.file_url(),
        "ref": "main",
        "submodules": False,
        "auth": {"$secret": "tok"},
        "username": "me",
    }


class _Ctx:
    """Just enough of a Context to see what the library passes on (no runtime)."""

    def __init__(self) -> None:
        self.declared: list[tuple[Any, ...]] = []
        self.steps: list[tuple[Any, ...]] = []

    def declare(self, *args: Any, **kwargs: Any) -> Any:
        self.declared.append((args, kwargs))

    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.steps.append((name, args))
        return fn(*args, **kwargs)


def test_the_library_refuses_credentials_and_passes_options_only_when_given(upstream: Upstream) -> None:
    ctx: Any = _Ctx()
    with pytest.raises(ValueError, match="credentials") as caught:
        gitlib.checkout(ctx, "x", repository="https://bot:hunter2@example.com/a.git")
    assert "hunter2" not in str(caught.value)
    with pytest.raises(TypeError, match=r"ctx\.secret"):
        gitlib.checkout(ctx, "x", repository="https://example.com/a.git", auth="hunter2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="depth"):
        gitlib.checkout(ctx, "x", repository="https://example.com/a.git", depth=0)
    assert ctx.declared == []
    gitlib.checkout(ctx, "a", repository=upstream.file_url())
    gitlib.checkout(ctx, "b", repository=upstream.file_url(), reconcile_every=30, on_drift="report")
    assert ctx.declared[0][1] == {"parent": None}
    assert ctx.declared[1][1] == {"parent": None, "reconcile_every": 30, "on_drift": "report"}
    # Steps get the secret's name, never a value (steps' arguments are not journaled either).
    refs = gitlib.ls_remote(ctx, upstream.file_url())
    assert refs["refs/heads/main"] == upstream.shas["second"]
    assert ctx.steps[0] == ("git.ls_remote", (upstream.file_url(), None, None))
