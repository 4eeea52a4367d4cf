"""Git sources for pipeline delivery (``apps.pipelines.delivery.gitsource``), against real servers.

``git daemon`` (git://), git's smart HTTP behind Basic auth and ``file://`` URLs serve fresh
upstream repositories (``tests/git/servers.py``): ``main`` (README, src/app.py), the tags
``v1`` (lightweight) and ``v2.0`` (annotated), the branch ``feature``.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from apps.pipelines.delivery.gitsource import SourceError, export, resolve
from kinds.git.cli import Credentials
from tests.git.conftest import HTTP_TOKEN, HTTP_USER
from tests.git.servers import GitDaemon, GitHTTP, Upstream, git
from tests.harness.net import free_port

LIMIT = 1 << 20  # far above the test trees; the oversize test uses a small one


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory export's own temporary repositories go to, empty to begin with."""
    path = tmp_path / "scratch"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    path = tmp_path / "dest"
    path.mkdir()
    return path


@pytest.fixture
def creds() -> Credentials:
    return Credentials(username=HTTP_USER, password=HTTP_TOKEN)


@pytest.fixture
def http_clean(http_git: GitHTTP) -> Iterator[GitHTTP]:
    """The HTTP server with its request log emptied; no command line showed its token meanwhile."""
    http_git.requests.clear()
    http_git.leaks.clear()
    yield http_git
    assert http_git.leaks == []


def files_in(root: Path) -> dict[str, bytes | str]:
    """Every file under ``root``: its bytes, or ``-> target`` for a symlink."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            found[rel] = f"-> {path.readlink()}"
        elif path.is_file():
            found[rel] = path.read_bytes()
    return found


def failure(call: Callable[..., object], *args: object, **kwargs: object) -> SourceError:
    with pytest.raises(SourceError) as raised:
        call(*args, **kwargs)
    return raised.value


def test_resolve_names_the_commit_of_a_branch_a_tag_and_a_sha(daemon: GitDaemon, upstream: Upstream) -> None:
    url = daemon.url(upstream)
    assert resolve(url, "main") == upstream.shas["second"]
    assert resolve(url, "feature") == upstream.shas["feature"]
    assert resolve(url, "refs/heads/feature") == upstream.shas["feature"]
    assert resolve(url, "HEAD") == upstream.shas["second"]
    assert resolve(url, "v1") == upstream.shas["first"]
    # An annotated tag is a tag object of its own: resolve gives the commit it tags.
    assert git("cat-file", "-t", "refs/tags/v2.0", cwd=upstream.bare) == "tag"
    assert resolve(url, "v2.0") == upstream.shas["second"]
    assert resolve(url, "refs/tags/v2.0") == upstream.shas["second"]
    # A full sha is the commit itself (lower case), whether a ref points at it or not.
    assert resolve(url, upstream.shas["first"].upper()) == upstream.shas["first"]
    assert resolve(upstream.file_url(), "v2.0") == upstream.shas["second"]


def test_a_push_moves_what_a_branch_resolves_to(daemon: GitDaemon, upstream: Upstream) -> None:
    url = daemon.url(upstream)
    before = resolve(url, "main")
    pushed = upstream.commit("third", {"README": "version 3\n"})
    assert pushed != before
    assert resolve(url, "main") == pushed
    assert resolve(url, "v2.0") == before  # a tag stays where it was


def test_a_name_that_is_a_branch_and_a_tag_on_different_commits_is_ambiguous(
    daemon: GitDaemon, upstream: Upstream
) -> None:
    git("push", "--quiet", "origin", f"{upstream.shas['second']}:refs/heads/v1", cwd=upstream.work)
    error = failure(resolve, daemon.url(upstream), "v1")
    assert error.code == "ambiguous_ref"
    assert "refs/tags/v1" in error.detail
    assert "refs/heads/v1" in error.detail
    assert resolve(daemon.url(upstream), "refs/tags/v1") == upstream.shas["first"]
    assert resolve(daemon.url(upstream), "refs/heads/v1") == upstream.shas["second"]


def test_a_ref_that_does_not_exist_lists_refs_that_do(daemon: GitDaemon, upstream: Upstream) -> None:
    error = failure(resolve, daemon.url(upstream), "release")
    assert error.code == "ref_not_found"
    assert error.permanent
    assert "'release'" in error.detail
    assert daemon.url(upstream) in error.detail
    assert "Branches: feature, main." in error.detail
    assert "Tags: v1, v2.0." in error.detail
    # An abbreviated sha cannot be looked up on a server: the message says to give all of it.
    short = failure(resolve, daemon.url(upstream), upstream.shas["first"][:10])
    assert short.code == "ref_not_found"
    assert "give all 40 characters" in short.detail


def test_export_writes_the_commits_files_exactly_and_nothing_else(
    daemon: GitDaemon, upstream: Upstream, dest: Path, scratch: Path
) -> None:
    work = upstream.work
    (work / "bin").mkdir()
    (work / "bin" / "run").write_text("#!/bin/sh\necho run\n")
    (work / "bin" / "run").chmod(0o755)
    (work / "lib").mkdir()
    (work / "lib" / "current").symlink_to("../src")  # inside the tree: kept, as a link
    (work / "blob.bin").write_bytes(bytes(range(256)))
    # Attributes that a checkout would apply (CRLF line endings): export writes the blobs.
    (work / ".gitattributes").write_text("*.txt text eol=crlf\n")
    (work / "notes.txt").write_bytes(b"one\ntwo\n")
    git("add", "--all", cwd=work)
    # A submodule (a gitlink) is neither fetched nor represented.
    git("update-index", "--add", "--cacheinfo", f"160000,{upstream.shas['first']},vendor/lib", cwd=work)
    git("commit", "--quiet", "-m", "more kinds of entries", cwd=work)
    git("push", "--quiet", "origin", "main", cwd=work)

    commit = resolve(daemon.url(upstream), "main")
    export(daemon.url(upstream), commit, dest, max_bytes=LIMIT)

    assert files_in(dest) == {
        ".gitattributes": b"*.txt text eol=crlf\n",
        "README": b"version 2\n",
        "bin/run": b"#!/bin/sh\necho run\n",
        "blob.bin": bytes(range(256)),
        "lib/current": "-> ../src",
        "notes.txt": b"one\ntwo\n",
        "src/app.py": b"print('v1')\n",
    }
    assert not (dest / ".git").exists()
    assert not (dest / "vendor").exists()
    assert (dest / "bin" / "run").stat().st_mode & 0o111
    assert not (dest / "README").stat().st_mode & 0o111
    assert (dest / "lib" / "current" / "app.py").read_text() == "print('v1')\n"
    assert list(scratch.iterdir()) == []  # the temporary repository is gone


def test_export_of_a_subdirectory_over_authenticated_http(
    http_clean: GitHTTP, upstream: Upstream, creds: Credentials, dest: Path, scratch: Path
) -> None:
    url = http_clean.url(upstream)
    commit = resolve(url, "v1", creds)
    assert commit == upstream.shas["first"]
    export(url, commit, dest, subdirectory="./src/", credentials=creds, max_bytes=LIMIT)
    assert files_in(dest) == {"app.py": b"print('v1')\n"}
    assert any(ok for _method, _path, ok in http_clean.requests), "git sent the credential when challenged"
    assert list(scratch.iterdir()) == []


def test_an_unreachable_repository(
    daemon: GitDaemon, http_git: GitHTTP, creds: Credentials, dest: Path, scratch: Path, tmp_path: Path
) -> None:
    port = free_port()  # nothing listens there
    sha = "0" * 40
    for url in (f"git://127.0.0.1:{port}/app.git", f"http://127.0.0.1:{port}/app.git"):
        error = failure(resolve, url, "main")
        assert error.code == "unreachable", error.detail
        assert url in error.detail
        assert "connect" in error.detail.lower()
        assert failure(export, url, sha, dest, max_bytes=LIMIT).code == "unreachable"
    # A server that answers but has no such repository; a path that is not a repository.
    for url, auth in (
        (f"git://127.0.0.1:{daemon.port}/missing.git", None),
        (f"http://127.0.0.1:{http_git.port}/missing.git", creds),
        ((tmp_path / "missing.git").as_uri(), None),
    ):
        error = failure(resolve, url, "main", auth)
        assert error.code == "unreachable", error.detail
        assert error.detail.startswith(f"there is no git repository at {url}")
        assert error.permanent
    assert list(dest.iterdir()) == []
    assert list(scratch.iterdir()) == []


def test_a_credential_the_server_refuses_is_named_never_shown(
    http_clean: GitHTTP, upstream: Upstream, dest: Path, scratch: Path
) -> None:
    wrong = "wrong-" + uuid.uuid4().hex
    bad = Credentials(username=HTTP_USER, password=wrong)
    url = http_clean.url(upstream)
    refused = failure(resolve, url, "main", bad)
    assert refused.code == "credential_refused"
    assert refused.permanent
    assert HTTP_USER in refused.detail
    assert url in refused.detail
    exported = failure(export, url, upstream.shas["first"], dest, credentials=bad, max_bytes=LIMIT)
    assert exported.code == "credential_refused"
    for error in (refused, exported):
        assert wrong not in f"{error} {error.detail} {error!r} {error.__cause__} {error.__context__}"
    assert http_clean.requests
    assert not any(ok for _method, _path, ok in http_clean.requests)
    assert wrong not in "".join(http_clean.leaks)
    # No credential at all for a server that wants one: said so, not "refused".
    missing = failure(resolve, url, "main")
    assert missing.code == "credential_required"
    assert "none was given" in missing.detail
    assert list(dest.iterdir()) == []
    assert list(scratch.iterdir()) == []


def test_a_subdirectory_that_is_not_in_the_commit(
    daemon: GitDaemon, upstream: Upstream, dest: Path, scratch: Path
) -> None:
    url = daemon.url(upstream)
    commit = upstream.shas["second"]
    error = failure(export, url, commit, dest, subdirectory="pipelines", max_bytes=LIMIT)
    assert error.code == "subdirectory_not_found"
    assert "'pipelines'" in error.detail
    assert commit in error.detail
    assert "does not exist" in error.detail
    a_file = failure(export, url, commit, dest, subdirectory="src/app.py", max_bytes=LIMIT)
    assert a_file.code == "subdirectory_not_found"
    assert "is a file" in a_file.detail
    assert list(dest.iterdir()) == []
    assert list(scratch.iterdir()) == []


def test_a_commit_the_server_does_not_have(daemon: GitDaemon, upstream: Upstream, dest: Path) -> None:
    missing = uuid.uuid4().hex + "deadbeef"
    assert resolve(daemon.url(upstream), missing) == missing  # accepted: only a fetch can tell
    error = failure(export, daemon.url(upstream), missing, dest, max_bytes=LIMIT)
    assert error.code == "commit_not_found"
    assert missing in error.detail
    assert list(dest.iterdir()) == []


def test_an_oversize_tree_is_refused_before_anything_is_written(
    daemon: GitDaemon, upstream: Upstream, dest: Path, scratch: Path
) -> None:
    url = daemon.url(upstream)
    commit = upstream.shas["second"]
    size = len("version 2\n") + len("print('v1')\n")  # README and src/app.py
    error = failure(export, url, commit, dest, max_bytes=size - 1)
    assert error.code == "too_large"
    assert f"{size} bytes" in error.detail
    assert f"limit of {size - 1} bytes" in error.detail
    assert list(dest.iterdir()) == []
    assert list(scratch.iterdir()) == []
    export(url, commit, dest, max_bytes=size)  # exactly the limit fits
    assert set(files_in(dest)) == {"README", "src/app.py"}


def test_a_symlink_leading_out_of_the_exported_tree_is_refused(
    daemon: GitDaemon, upstream: Upstream, dest: Path, scratch: Path
) -> None:
    work = upstream.work
    (work / "src" / "shared").symlink_to("../README")  # inside the repository, outside src/
    (work / "up").symlink_to("..")  # the root itself: inside
    (work / "src" / "via").symlink_to("../up/..")  # ...but through it, one level above the root
    git("add", "--all", cwd=work)
    git("commit", "--quiet", "-m", "links", cwd=work)
    git("push", "--quiet", "origin", "main", cwd=work)
    url = daemon.url(upstream)
    commit = resolve(url, "main")

    error = failure(export, url, commit, dest, subdirectory="src", max_bytes=LIMIT)
    assert error.code == "unsafe_symlink"
    assert "'shared'" in error.detail
    assert "'../README'" in error.detail
    through = failure(export, url, commit, dest, max_bytes=LIMIT)
    assert through.code == "unsafe_symlink"
    assert "'src/via'" in through.detail
    assert list(dest.iterdir()) == []
    assert list(scratch.iterdir()) == []


def test_inputs_are_refused_before_anything_runs(
    http_clean: GitHTTP, upstream: Upstream, creds: Credentials, dest: Path, tmp_path: Path
) -> None:
    url = http_clean.url(upstream)
    sha = upstream.shas["first"]
    bad_urls = [
        "",
        "ftp://127.0.0.1/app.git",
        "ext::sh -c touch% /tmp/pwned",
        "git@127.0.0.1:app.git",
        "http:///app.git",
        url + " ",
    ]
    for bad_url in bad_urls:
        assert failure(resolve, bad_url, "main").code == "invalid", bad_url
        assert failure(export, bad_url, sha, dest, max_bytes=LIMIT).code == "invalid", bad_url
    secret_url = url.replace("http://", "http://me:hunter2@")
    error = failure(resolve, secret_url, "main")
    assert error.code == "invalid"
    assert "hunter2" not in error.detail
    assert failure(resolve, f"git://127.0.0.1:{free_port()}/app.git", "main", creds).code == "invalid"
    for bad_ref in ("", "main branch", "main\n", "-main", "ma\x00in"):
        assert failure(resolve, url, bad_ref, creds).code == "invalid", bad_ref
    for bad_commit in ("", "main", sha[:12], sha + "0", "g" * 40):
        assert failure(export, url, bad_commit, dest, credentials=creds, max_bytes=LIMIT).code == "invalid"
    for bad_sub in ("../app", "src/../../etc", "/etc", ".git", "src\n"):
        refused = failure(export, url, sha, dest, subdirectory=bad_sub, credentials=creds, max_bytes=LIMIT)
        assert refused.code == "invalid", bad_sub
    for bad_max in (0, -1, True):
        assert failure(export, url, sha, dest, credentials=creds, max_bytes=bad_max).code == "invalid"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("mine\n")
    for bad_dest in (tmp_path / "full", tmp_path / "absent", tmp_path / "full" / "keep"):
        assert failure(export, url, sha, bad_dest, credentials=creds, max_bytes=LIMIT).code == "invalid"
    assert (tmp_path / "full" / "keep").read_text() == "mine\n"
    assert http_clean.requests == []  # the server never heard of any of it
    assert list(dest.iterdir()) == []
