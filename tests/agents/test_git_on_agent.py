"""Git checkouts on an agent's machine: checked out, healed and removed by the agent running git
itself (real agent, web server, worker; real repositories behind git daemon and git's smart
HTTP with Basic auth, on loopback)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from apps.agents.models import AgentCommand
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Event, Record
from apps.secrets.services import secret_create
from tests.agents.conftest import wait_phase
from tests.agents.test_ssh_install import files_containing, tables_containing
from tests.conftest import Worker, wait_for
from tests.git import conftest as git_fixtures
from tests.git.conftest import HTTP_TOKEN, HTTP_USER
from tests.git.servers import GitDaemon, GitHTTP, Upstream, git
from tests.harness.agents import AgentProcess

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

# The git tests' servers and upstream repositories (git daemon, smart HTTP with Basic auth).
served = git_fixtures.served
daemon = git_fixtures.daemon
http_git = git_fixtures.http_git
upstream = git_fixtures.upstream


@pytest.fixture
def worker(workers: list[Worker]) -> Worker:
    return workers[0]


def declare(agent: Record, path: Path | str, name: str = "src", **spec: Any) -> Record:
    return records.record_declare(
        kind="git.checkout", name=name, owner=agent, spec={**spec, "path": str(path), "agent": str(agent.pk)}
    )


def calls(record: Record, operation: str) -> list[AgentCommand]:
    """The call commands of ``operation`` for the record (of any generation: ``create@2``)."""
    commands = AgentCommand.objects.filter(waiting_record_id=record.pk, kind="call")
    return [c for c in commands if c.operation.split("@")[0] == operation]


def test_a_checkout_on_a_machine_is_made_healed_and_removed_by_its_agent(
    agents: Callable[..., tuple[Record, AgentProcess]],
    worker: Worker,
    tmp_path: Path,
    daemon: GitDaemon,
    upstream: Upstream,
) -> None:
    agent, _process = agents("builder")
    wait_phase(agent, Phase.READY)
    path = tmp_path / "machine" / "build" / "src"
    record = declare(agent, path, repository=daemon.url(upstream), ref="main")

    ready = wait_phase(record, Phase.READY)
    assert ready.outputs["commit"] == upstream.shas["second"]
    assert ready.outputs["path"] == str(path)
    assert ready.outputs["branch"] == "main"
    assert ready.outputs["agent"] == str(agent.pk)
    assert ready.outputs["adopted"] is False
    assert (path / "README").read_text() == "version 2\n"
    assert (path / ".git" / "graphene-record").read_text().strip() == str(record.pk)
    assert git("symbolic-ref", "--short", "HEAD", cwd=path) == "main"
    [create] = calls(record, "create")
    assert create.consumed_at is not None
    assert "$sealed" not in create.payload, "no credential: not sealed"
    assert create.payload["args"][4] == ""

    # A dirty tree behind Graphene's back: observed through the agent, healed by it.
    (path / "README").write_text("edited on the machine\n")
    (path / "build.log").write_text("untracked output\n")
    counts = records.records_observe(record_ids=[record.pk])
    assert counts["healing"] == 1, counts
    wait_for(lambda: Record.objects.get(pk=record.pk).heals == 1, timeout=30, what="the first heal")
    wait_phase(record, Phase.READY)
    assert (path / "README").read_text() == "version 2\n"
    assert (path / "build.log").exists(), "untracked files are not drift and stay"
    drift = Event.objects.filter(record=record, type="drift_detected").latest("created_at")
    assert [c["field"] for c in drift.data["changes"]] == ["dirty"]

    # A moved HEAD (upstream moved on too): back to the commit it converged to, not the new tip.
    upstream.commit("third", {"README": "version 3\n"})
    git("checkout", "--quiet", "--force", upstream.shas["first"], cwd=path)
    counts = records.records_observe(record_ids=[record.pk])
    assert counts["healing"] == 1, counts
    wait_for(lambda: Record.objects.get(pk=record.pk).heals == 2, timeout=30, what="the second heal")
    healed = wait_phase(record, Phase.READY)
    assert healed.outputs["commit"] == upstream.shas["second"]
    assert git("rev-parse", "HEAD", cwd=path) == upstream.shas["second"]
    assert git("symbolic-ref", "--short", "HEAD", cwd=path) == "main"
    drift = Event.objects.filter(record=record, type="drift_detected").latest("created_at")
    assert [c["field"] for c in drift.data["changes"]] == ["commit"]

    # Deleting removes the directory through the agent.
    records.record_delete_request(record=record)
    wait_phase(record, Phase.DELETED)
    assert not path.exists()
    assert [p.name for p in path.parent.iterdir()] == [], "nothing left aside"
    assert len(calls(record, "remove")) == 1
    assert not Event.objects.filter(record=record, reason="DeletionAbandoned").exists()


def test_an_unexpected_commit_fails_at_once_and_leaves_the_tree_alone(
    agents: Callable[..., tuple[Record, AgentProcess]], worker: Worker, tmp_path: Path, upstream: Upstream
) -> None:
    agent, _process = agents("pinned")
    wait_phase(agent, Phase.READY)
    fresh = tmp_path / "fresh"
    record = declare(agent, fresh, repository=upstream.file_url(), ref="main", expected_commit=upstream.shas["first"])
    failed = wait_phase(record, Phase.CREATE_FAILED)
    assert failed.attempts == 1, "a mismatch is permanent: never retried"
    assert upstream.shas["first"] in failed.last_error
    assert upstream.shas["second"] in failed.last_error
    assert len(calls(record, "create")) == 1
    assert sorted(p.name for p in fresh.iterdir()) == [".git"], "checked before the working tree is touched"

    # An existing checkout (at v1) whose new generation expects another commit: left as it was.
    kept = tmp_path / "kept"
    first = declare(agent, kept, name="kept", repository=upstream.file_url(), ref="v1")
    wait_phase(first, Phase.READY)
    again = declare(
        agent, kept, name="kept", repository=upstream.file_url(), ref="main", expected_commit=upstream.shas["first"]
    )
    assert again.pk == first.pk
    failed = wait_phase(first, Phase.CREATE_FAILED)  # the new generation
    assert failed.attempts == 1, failed.last_error
    assert "not the expected commit" in failed.last_error
    assert (kept / "README").read_text() == "version 1\n"
    assert git("rev-parse", "HEAD", cwd=kept) == upstream.shas["first"]
    assert git("status", "--porcelain", cwd=kept) == ""

    records.record_delete_request(record=agent)
    wait_phase(agent, Phase.DELETED)
    assert not fresh.exists()
    assert not kept.exists()


def test_a_strangers_directory_on_the_machine_is_never_adopted(
    agents: Callable[..., tuple[Record, AgentProcess]], worker: Worker, tmp_path: Path, upstream: Upstream
) -> None:
    agent, _process = agents("stranger")
    wait_phase(agent, Phase.READY)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine\n")
    git("init", "--quiet", str(theirs))  # a repository too, but not one of ours
    before = sorted((p.name, p.stat().st_mtime_ns) for p in theirs.iterdir())
    record = declare(agent, theirs, name="theirs", repository=upstream.file_url())
    failed = wait_phase(record, Phase.CREATE_FAILED)
    assert failed.attempts == 1
    assert "belongs to no Graphene record" in failed.last_error
    assert "refusing to adopt" in failed.last_error

    # Another record's checkout is a stranger too.
    shared = tmp_path / "shared"
    owner = declare(agent, shared, name="a", repository=upstream.file_url())
    wait_phase(owner, Phase.READY)
    second = declare(agent, shared, name="b", repository=upstream.file_url())
    assert f"record {owner.pk}" in wait_phase(second, Phase.CREATE_FAILED).last_error

    relative = declare(agent, "relative/src", name="relative", repository=upstream.file_url())
    assert "absolute path" in wait_phase(relative, Phase.CREATE_FAILED).last_error

    # b's deletion leaves a's checkout alone; nothing's deletion touches the stranger's directory.
    records.record_delete_request(record=second)
    wait_phase(second, Phase.DELETED)
    assert (shared / ".git" / "graphene-record").read_text().strip() == str(owner.pk)
    records.record_delete_request(record=agent)
    wait_phase(agent, Phase.DELETED)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in theirs.iterdir()) == before
    assert (theirs / "notes.txt").read_text() == "mine\n"
    assert not shared.exists()


def test_a_token_reaches_git_on_the_machine_sealed_and_through_the_environment_only(
    agents: Callable[..., tuple[Record, AgentProcess]],
    worker: Worker,
    tmp_path: Path,
    http_git: GitHTTP,
    upstream: Upstream,
    api: Any,
) -> None:
    secret = f"git-token-{uuid.uuid4().hex[:6]}"
    secret_create(name=secret, value=HTTP_TOKEN + "\n")
    agent, process = agents("private")
    wait_phase(agent, Phase.READY)
    http_git.requests.clear()
    http_git.clients_seen.clear()
    http_git.leaks.clear()
    path = tmp_path / "private-src"
    record = declare(
        agent, path, repository=http_git.url(upstream), ref="main", auth={"$secret": secret}, username=HTTP_USER
    )
    ready = wait_phase(record, Phase.READY)
    assert ready.outputs["commit"] == upstream.shas["second"]
    assert (path / "README").read_text() == "version 2\n"
    # git asked only when challenged, then answered with the token...
    assert any(not ok for _m, _p, ok in http_git.requests), "the server challenged"
    assert any(ok for _m, _p, ok in http_git.requests), "git answered with the token"
    # ...and while it talked to the server no process on the machine showed it in its argv.
    assert http_git.clients_seen, "the scan ran while a git client was connected"
    assert http_git.leaks == []

    # The command that carried it is stored sealed, and shown as such.
    [create] = calls(record, "create")
    assert set(create.payload) == {"$sealed", "name"}
    shown = api.get(f"/api/v1/agents/{agent.pk}/commands/{create.pk}/")
    assert shown.status_code == 200, shown.content
    assert shown.json()["payload"]["$sealed"] == "<encrypted>"

    # A wrong token fails at once, and git's answer is redacted on the way back.
    wrong = "wrong-" + HTTP_TOKEN
    secret_create(name=secret + "-stale", value=wrong)
    stale = declare(
        agent,
        tmp_path / "stale-src",
        name="stale",
        repository=http_git.url(upstream),
        auth={"$secret": secret + "-stale"},
        username=HTTP_USER,
    )
    failed = wait_phase(stale, Phase.CREATE_FAILED)
    assert failed.attempts == 1, "refused credentials are permanent"
    assert "Authentication failed" in failed.last_error

    records.record_delete_request(record=agent)
    wait_phase(record, Phase.DELETED)
    wait_phase(agent, Phase.DELETED)
    assert not path.exists()
    process.stop()
    # Nowhere at rest: no table (payloads, results, outputs, events, logs), no file under this
    # test's directory (the checkout, the agent's state and journal, the agent's, web server's
    # and worker's logs), no git configuration of the machine.
    for needle in (HTTP_TOKEN, wrong):
        assert tables_containing(needle) == []
        assert files_containing(needle, tmp_path, *[p for p in (Path.home() / ".gitconfig",) if p.exists()]) == []
    assert process.output(), "the agent's log was written"
