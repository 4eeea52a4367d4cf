"""The ``git.checkout`` kind against real repositories: git daemon (git://) and file:// URLs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from kinds import Drift, PermanentError, get_kind
from kinds.git.checkout import CheckoutKind, read_marker, root, tmp_path
from tests import factories
from tests.git.conftest import declare, delete
from tests.git.servers import GitDaemon, Upstream, git, make_upstream

pytestmark = pytest.mark.django_db

kind = get_kind("git.checkout")


def marked_dirs(record_id: str) -> list[Path]:
    """Every checkout directory on the server carrying ``record_id`` (the sweeper's view)."""
    return [Path(m.external_id) for m in kind.sweep() if m.record_id == record_id]


def test_the_kind_is_registered() -> None:
    assert isinstance(kind, CheckoutKind)
    assert kind.drift_interval is not None
    assert kind.drift_interval.total_seconds() == 60


def test_checkout_of_a_branch_over_git_daemon(
    eager: None, django_capture_on_commit_callbacks: Any, daemon: GitDaemon, upstream: Upstream
) -> None:
    record = declare(django_capture_on_commit_callbacks, "src", repository=daemon.url(upstream), ref="main")
    assert record.phase == Phase.READY, record.last_error
    path = Path(record.outputs["path"])
    assert path == root() / str(record.pk)
    assert record.outputs["commit"] == upstream.shas["second"]
    assert record.outputs["ref"] == "main"
    assert record.outputs["branch"] == "main"
    assert (path / "README").read_text() == "version 2\n"
    assert read_marker(path) == str(record.pk)
    # A local branch of the same name, so that a commit can be pushed back to it.
    assert git("symbolic-ref", "--short", "HEAD", cwd=path) == "main"
    assert git("status", "--porcelain", cwd=path) == ""

    feature = declare(django_capture_on_commit_callbacks, "feat", repository=daemon.url(upstream), ref="feature")
    assert feature.outputs["commit"] == upstream.shas["feature"]
    assert (Path(feature.outputs["path"]) / "FEATURE").exists()

    default = declare(django_capture_on_commit_callbacks, "default", repository=daemon.url(upstream))
    assert default.outputs["commit"] == upstream.shas["second"]  # HEAD: the default branch, detached
    assert default.outputs["branch"] is None


def test_checkout_of_tags_and_a_commit_over_file_urls(
    eager: None, django_capture_on_commit_callbacks: Any, upstream: Upstream
) -> None:
    url = upstream.file_url()
    annotated = declare(django_capture_on_commit_callbacks, "v2", repository=url, ref="v2.0", depth=1)
    assert annotated.phase == Phase.READY, annotated.last_error
    path = Path(annotated.outputs["path"])
    assert annotated.outputs["commit"] == upstream.shas["second"]  # the tag peeled to its commit
    assert annotated.outputs["branch"] is None
    assert git("rev-parse", "--is-shallow-repository", cwd=path) == "true"
    assert git("rev-list", "--count", "HEAD", cwd=path) == "1"

    light = declare(django_capture_on_commit_callbacks, "v1", repository=url, ref="refs/tags/v1")
    assert light.outputs["commit"] == upstream.shas["first"]
    assert (Path(light.outputs["path"]) / "README").read_text() == "version 1\n"

    pinned = declare(
        django_capture_on_commit_callbacks,
        "pinned",
        repository=url,
        ref=upstream.shas["first"],
        expected_commit=upstream.shas["first"],
    )
    assert pinned.phase == Phase.READY, pinned.last_error
    assert pinned.outputs["commit"] == upstream.shas["first"]


def test_an_unexpected_commit_fails_at_once_naming_both(
    eager: None, django_capture_on_commit_callbacks: Any, upstream: Upstream
) -> None:
    record = declare(
        django_capture_on_commit_callbacks,
        "pinned",
        repository=upstream.file_url(),
        ref="main",
        expected_commit=upstream.shas["first"],
    )
    assert record.phase == Phase.CREATE_FAILED
    assert record.attempts == 1, "a mismatch is permanent: never retried"
    assert upstream.shas["first"] in record.last_error
    assert upstream.shas["second"] in record.last_error
    errors = Event.objects.filter(record=record, type=EventType.ERROR)
    assert errors.count() == 1
    failed = Event.objects.get(record=record, type=EventType.PHASE_CHANGED, data__to=Phase.CREATE_FAILED)
    assert failed.reason == "PermanentError"
    # Checked before the working tree is touched: the directory holds no checkout.
    path = root() / str(record.pk)
    assert read_marker(path) == str(record.pk)
    assert sorted(p.name for p in path.iterdir()) == [".git"]
    assert delete(django_capture_on_commit_callbacks, record).phase == Phase.DELETED
    assert not path.exists()


def test_a_ref_that_does_not_exist_fails_permanently(
    eager: None, django_capture_on_commit_callbacks: Any, upstream: Upstream
) -> None:
    record = declare(django_capture_on_commit_callbacks, "nope", repository=upstream.file_url(), ref="no-such-branch")
    assert record.phase == Phase.CREATE_FAILED
    assert record.attempts == 1
    assert "no-such-branch" in record.last_error


def test_a_retried_create_adopts_the_directory(
    eager: None, django_capture_on_commit_callbacks: Any, upstream: Upstream
) -> None:
    record = declare(django_capture_on_commit_callbacks, "src", repository=upstream.file_url(), ref="main")
    path = Path(record.outputs["path"])
    # A worker that died after the checkout was made but before its outputs were committed:
    # the retried create finds the marked directory and converges it, making no second one.
    again = kind.create(record)
    assert again["adopted"] is True
    assert again["path"] == str(path)
    assert again["commit"] == record.outputs["commit"]
    assert marked_dirs(str(record.pk)) == [path]
    # An adopted checkout is converged: changed tracked files and a moved HEAD are put back.
    git("checkout", "--quiet", upstream.shas["first"], cwd=path)
    (path / "README").write_text("edited\n")
    kind.create(record)
    assert (path / "README").read_text() == "version 2\n"
    assert git("rev-parse", "HEAD", cwd=path) == upstream.shas["second"]


def test_a_crash_mid_create_leaves_nothing_the_retry_trips_on(
    eager: None, django_capture_on_commit_callbacks: Any, upstream: Upstream
) -> None:
    record = declare(django_capture_on_commit_callbacks, "src", repository=upstream.file_url(), ref="v1")
    path = Path(record.outputs["path"])
    shutil.rmtree(path)
    # What a crash between ``git init`` and the rename leaves: the aside directory, ours by name.
    aside = tmp_path(path, str(record.pk))
    aside.mkdir(parents=True)
    (aside / "half-written").write_text("x")
    assert {m.external_id for m in kind.sweep() if m.record_id == str(record.pk)} == {str(aside)}
    outputs = kind.create(record)
    assert outputs["adopted"] is False
    assert not aside.exists()
    assert marked_dirs(str(record.pk)) == [path]


def test_a_strangers_directory_is_never_touched(
    eager: None, django_capture_on_commit_callbacks: Any, upstream: Upstream
) -> None:
    theirs = root() / "team" / "theirs"
    theirs.mkdir(parents=True, exist_ok=True)
    (theirs / "notes.txt").write_text("mine\n")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in theirs.iterdir())
    record = declare(django_capture_on_commit_callbacks, "src", repository=upstream.file_url(), path="team/theirs")
    assert record.phase == Phase.CREATE_FAILED
    assert record.attempts == 1
    assert "refusing to adopt" in record.last_error
    assert "no Graphene record" in record.last_error

    # Another record's checkout is a stranger too.
    other = declare(django_capture_on_commit_callbacks, "a", repository=upstream.file_url(), path="team/shared")
    assert other.phase == Phase.READY, other.last_error
    second = declare(django_capture_on_commit_callbacks, "b", repository=upstream.file_url(), path="team/shared")
    assert second.phase == Phase.CREATE_FAILED
    assert f"record {other.pk}" in second.last_error

    escape = declare(django_capture_on_commit_callbacks, "up", repository=upstream.file_url(), path="../../etc")
    assert escape.phase == Phase.CREATE_FAILED
    assert "under the checkouts root" in escape.last_error

    delete(django_capture_on_commit_callbacks, record)
    delete(django_capture_on_commit_callbacks, second)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in theirs.iterdir()) == before
    assert (theirs / "notes.txt").read_text() == "mine\n"
    assert read_marker(root() / "team" / "shared") == str(other.pk), "b's deletion left a's checkout alone"
    assert [m.external_id for m in kind.sweep() if "theirs" in m.external_id] == []


def test_drift_is_a_moved_head_or_a_dirty_tree_not_a_moved_branch(
    eager: None, django_capture_on_commit_callbacks: Any, daemon: GitDaemon, upstream: Upstream
) -> None:
    record = declare(django_capture_on_commit_callbacks, "src", repository=daemon.url(upstream), ref="main")
    path = Path(record.outputs["path"])
    observed = kind.observe(record)
    assert observed is not None
    assert observed.outputs["commit"] == upstream.shas["second"]
    assert observed.outputs["dirty"] is False
    assert kind.diff(record, observed) == []

    # The branch moves upstream: the checkout is what the ref was when it converged.
    newer = upstream.commit("third", {"README": "version 3\n"})
    assert kind.diff(record, kind.observe(record)) == []  # type: ignore[arg-type]

    (path / "README").write_text("edited behind Graphene's back\n")
    (path / "untracked.log").write_text("build output\n")
    assert kind.diff(record, kind.observe(record)) == [Drift("dirty", False, True)]  # type: ignore[arg-type]
    git("checkout", "--quiet", "--force", upstream.shas["first"], cwd=path)
    assert kind.diff(record, kind.observe(record)) == [  # type: ignore[arg-type]
        Drift("commit", upstream.shas["second"], upstream.shas["first"])
    ]

    # A heal re-runs create: back to the commit it converged to (not the branch's new tip),
    # tracked changes discarded, untracked files kept.
    healed = kind.create(record)
    assert healed["commit"] == upstream.shas["second"]
    assert healed["branch"] == "main"
    assert git("symbolic-ref", "--short", "HEAD", cwd=path) == "main"
    assert (path / "README").read_text() == "version 2\n"
    assert (path / "untracked.log").exists()
    assert kind.diff(record, kind.observe(record)) == []  # type: ignore[arg-type]

    # Gone: re-created at that commit too, fetched by its sha although main has moved on.
    shutil.rmtree(path)
    assert kind.observe(record) is None
    again = kind.create(record)
    assert again["commit"] == upstream.shas["second"]
    assert again["adopted"] is False
    assert (path / "README").read_text() == "version 2\n"
    # A new generation of the spec resolves the ref again: that is how a checkout moves.
    record.generation += 1
    assert kind.create(record)["commit"] == newer


def test_the_drift_scheduler_reports_a_dirty_checkout(
    eager: None, django_capture_on_commit_callbacks: Any, upstream: Upstream
) -> None:
    from apps.records import services

    owner = factories.stand("git-drift")
    with django_capture_on_commit_callbacks(execute=True):
        record = services.record_declare(
            kind="git.checkout",
            name="watched",
            owner=owner,
            spec={"repository": upstream.file_url(), "ref": "main"},
            drift_policy="report",
        )
    record.refresh_from_db()
    assert record.phase == Phase.READY, record.last_error
    (Path(record.outputs["path"]) / "README").write_text("changed\n")
    with django_capture_on_commit_callbacks(execute=True):
        services.records_observe(record_ids=[record.pk])
    record.refresh_from_db()
    assert record.phase == Phase.DRIFTED
    drift = Event.objects.get(record=record, type=EventType.DRIFT_DETECTED)
    assert drift.data["changes"] == [{"field": "dirty", "desired": False, "actual": True}]


def test_delete_removes_only_ours_and_is_idempotent(
    eager: None, django_capture_on_commit_callbacks: Any, upstream: Upstream
) -> None:
    record = declare(django_capture_on_commit_callbacks, "src", repository=upstream.file_url(), path="deep/er/src")
    path = Path(record.outputs["path"])
    assert path == root() / "deep" / "er" / "src"
    assert marked_dirs(str(record.pk)) == [path]
    kind.delete(record)
    assert not path.exists()
    assert not tmp_path(path, str(record.pk)).exists()
    kind.delete(record)  # already gone: success
    # A crash mid-delete leaves the directory renamed aside: the retry finishes it.
    again = declare(django_capture_on_commit_callbacks, "again", repository=upstream.file_url())
    target = Path(again.outputs["path"])
    aside = tmp_path(target, str(again.pk))
    os.rename(target, aside)
    kind.delete(again)
    assert not aside.exists()
    assert delete(django_capture_on_commit_callbacks, again).phase == Phase.DELETED


def test_the_sweeper_removes_checkouts_whose_record_is_gone(
    eager: None, django_capture_on_commit_callbacks: Any, upstream: Upstream
) -> None:
    from apps.records import services

    record = declare(django_capture_on_commit_callbacks, "src", repository=upstream.file_url())
    path = Path(record.outputs["path"])
    backup = path.with_name("backup-of-" + path.name)
    shutil.copytree(path, backup, symlinks=True)  # a marked copy, as if a delete had been lost
    live = declare(django_capture_on_commit_callbacks, "live", repository=upstream.file_url())
    delete(django_capture_on_commit_callbacks, record)
    assert not path.exists()
    assert backup.exists()
    found = [f for f in services.records_sweep() if f["kind"] == "git.checkout"]
    assert {f["external_id"] for f in found if f["record_id"] == str(record.pk)} == {str(backup)}
    assert not backup.exists()
    assert Path(live.outputs["path"]).exists(), "a live record's checkout is kept"


def test_submodules_are_checked_out_recursively(
    eager: None, django_capture_on_commit_callbacks: Any, daemon: GitDaemon, upstream: Upstream
) -> None:
    library = make_upstream(upstream.bare.parent, upstream.name.removesuffix(".git") + "-lib")
    git("submodule", "--quiet", "add", daemon.url(library), "vendor/lib", cwd=upstream.work)
    with_sub = upstream.commit("add the library", {})
    record = declare(
        django_capture_on_commit_callbacks, "src", repository=daemon.url(upstream), ref="main", submodules=True
    )
    assert record.phase == Phase.READY, record.last_error
    assert record.outputs["commit"] == with_sub
    lib = Path(record.outputs["path"]) / "vendor" / "lib"
    assert (lib / "README").read_text() == "version 2\n"
    assert git("rev-parse", "HEAD", cwd=lib) == library.shas["second"]
    without = declare(django_capture_on_commit_callbacks, "nosub", repository=daemon.url(upstream), ref="main")
    assert not (Path(without.outputs["path"]) / "vendor" / "lib" / "README").exists()


def test_specs_that_would_carry_credentials_are_refused(django_capture_on_commit_callbacks: Any) -> None:
    from apps.core.errors import ValidationFailed

    for url in ("https://user:token@example.com/a.git", "https://token@example.com/a.git", "--upload-pack=x"):
        with pytest.raises(ValidationFailed):
            declare(django_capture_on_commit_callbacks, "bad", repository=url)
    with pytest.raises(ValidationFailed):
        declare(django_capture_on_commit_callbacks, "bad", repository="https://example.com/a.git", auth="token")
    with pytest.raises(ValidationFailed):
        declare(django_capture_on_commit_callbacks, "bad", repository="https://example.com/a.git", ref="--all")
    assert not Record.objects.filter(kind="git.checkout").exists()


def test_the_marker_must_be_ours_for_observe(
    eager: None, django_capture_on_commit_callbacks: Any, upstream: Upstream
) -> None:
    record = declare(django_capture_on_commit_callbacks, "src", repository=upstream.file_url())
    path = Path(record.outputs["path"])
    (path / ".git" / "graphene-record").write_text("someone-else\n")
    assert kind.observe(record) is None
    with pytest.raises(PermanentError):
        kind.create(record)


def test_a_new_generation_converges_in_place_or_moves(
    eager: None, django_capture_on_commit_callbacks: Any, upstream: Upstream
) -> None:
    from apps.records import services

    owner = factories.stand("git-generations")

    def apply(**spec: Any) -> Record:
        with django_capture_on_commit_callbacks(execute=True):
            record = services.record_declare(kind="git.checkout", name="src", owner=owner, spec=spec)
        record.refresh_from_db()
        assert record.phase == Phase.READY, record.last_error
        return record

    first = apply(repository=upstream.file_url(), ref="v1", path="gen/a")
    assert first.outputs["commit"] == upstream.shas["first"]
    second = apply(repository=upstream.file_url(), ref="feature", path="gen/a")
    assert second.pk == first.pk
    assert second.generation == 2
    assert second.outputs["commit"] == upstream.shas["feature"]
    assert second.outputs["adopted"] is True
    moved = apply(repository=upstream.file_url(), ref="feature", path="gen/b")
    assert moved.outputs["path"] == str(root() / "gen" / "b")
    assert not (root() / "gen" / "a").exists(), "the previous directory went with the move"
    assert marked_dirs(str(moved.pk)) == [root() / "gen" / "b"]
