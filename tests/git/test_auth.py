"""Credentials for http(s) repositories: from the secret store to git, through the environment only.

The server is git's own smart HTTP backend behind Basic authentication (see ``servers.GitHTTP``).
While each request is in flight it reads the command line of every process on the machine:
the token must never be in one (``ps`` shows them to every user). Afterwards the token must
be in no file of the checkout, no database table (specs, outputs, events, logs, journal) and
no git configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.records.choices import Phase
from apps.secrets.services import secret_create
from kinds.git import cli
from tests.agents.test_ssh_install import files_containing, tables_containing
from tests.git.conftest import HTTP_TOKEN, HTTP_USER, declare
from tests.git.servers import GitDaemon, GitHTTP, Upstream, git

pytestmark = pytest.mark.django_db

SECRET = "git-token"


def git_config_files() -> list[Path]:
    candidates = [Path.home() / ".gitconfig", Path.home() / ".git-credentials", Path("/etc/gitconfig")]
    return [p for p in candidates if p.exists()]


def test_a_token_reaches_git_only_through_its_environment(
    eager: None, django_capture_on_commit_callbacks: Any, http_git: GitHTTP, upstream: Upstream
) -> None:
    secret_create(name=SECRET, value=HTTP_TOKEN + "\n")  # a trailing newline, as `echo` leaves it
    http_git.requests.clear()
    http_git.clients_seen.clear()
    record = declare(
        django_capture_on_commit_callbacks,
        "private",
        repository=http_git.url(upstream),
        ref="main",
        auth={"$secret": SECRET},
        username=HTTP_USER,
    )
    assert record.phase == Phase.READY, record.last_error
    assert record.outputs["commit"] == upstream.shas["second"]
    assert (Path(record.outputs["path"]) / "README").read_text() == "version 2\n"
    # git asked for credentials only when challenged, and then sent the right ones.
    assert any(not ok for _m, _p, ok in http_git.requests), "the server challenged"
    assert any(ok for _m, _p, ok in http_git.requests), "git answered with the token"
    # While git talked to the server its processes were there to see; none showed the token.
    assert http_git.clients_seen, "the scan ran while a git client was connected"
    assert http_git.leaks == []
    assert record.spec["auth"] == {"$secret": SECRET}
    assert files_containing(HTTP_TOKEN, Path(record.outputs["path"]), *git_config_files()) == []
    assert tables_containing(HTTP_TOKEN) == []


def test_the_argv_never_holds_the_token() -> None:
    creds = cli.Credentials(username=HTTP_USER, password=HTTP_TOKEN)
    url = "https://git.example.com/org/app.git"
    env = cli.environment(url, creds, base={"PATH": "/usr/bin"})
    assert [k for k, v in env.items() if HTTP_TOKEN in v] == [cli.PASSWORD_ENV]
    helper = [env[k.replace("KEY", "VALUE")] for k, v in env.items() if k.startswith("GIT_CONFIG_KEY_")]
    assert all(HTTP_TOKEN not in h for h in helper)
    # The helper answers for the repository's host only; the machine's helpers are reset, and
    # no hook runs with the token in its environment.
    keys = [env[f"GIT_CONFIG_KEY_{i}"] for i in range(int(env["GIT_CONFIG_COUNT"]))]
    assert keys == ["core.hooksPath", "credential.helper", "credential.https://git.example.com.helper"]
    assert HTTP_TOKEN not in " ".join(cli.command(["fetch", "origin", "main"], Path("/tmp/x")))
    assert HTTP_TOKEN not in repr(creds)
    # Whatever git prints is redacted before it can reach an error message.
    assert cli.redact(f"fatal: bad token {HTTP_TOKEN}", creds) == "fatal: bad token ***"


def test_a_wrong_token_fails_at_once_without_showing_it(
    eager: None, django_capture_on_commit_callbacks: Any, http_git: GitHTTP, upstream: Upstream
) -> None:
    wrong = "wrong-" + HTTP_TOKEN
    secret_create(name="stale", value=wrong)
    record = declare(
        django_capture_on_commit_callbacks,
        "stale",
        repository=http_git.url(upstream),
        auth={"$secret": "stale"},
        username=HTTP_USER,
    )
    assert record.phase == Phase.CREATE_FAILED
    assert record.attempts == 1, "refused credentials are permanent"
    assert "Authentication failed" in record.last_error
    assert tables_containing(wrong) == []

    anonymous = declare(django_capture_on_commit_callbacks, "anon", repository=http_git.url(upstream))
    assert anonymous.phase == Phase.CREATE_FAILED
    assert anonymous.attempts == 1
    assert "terminal prompts disabled" in anonymous.last_error


def test_a_missing_secret_or_a_protocol_without_auth_fails_naming_it(
    eager: None, django_capture_on_commit_callbacks: Any, daemon: GitDaemon, http_git: GitHTTP, upstream: Upstream
) -> None:
    missing = declare(
        django_capture_on_commit_callbacks, "missing", repository=http_git.url(upstream), auth={"$secret": "nope"}
    )
    assert missing.phase == Phase.CREATE_FAILED
    assert missing.attempts == 1
    assert "secret 'nope' does not exist" in missing.last_error
    secret_create(name=SECRET, value=HTTP_TOKEN)
    git_url = declare(
        django_capture_on_commit_callbacks, "daemon", repository=daemon.url(upstream), auth={"$secret": SECRET}
    )
    assert git_url.phase == Phase.CREATE_FAILED
    assert "http(s)" in git_url.last_error
    assert not Path(git_url.outputs.get("path") or "/nonexistent").exists()


def test_the_token_is_offered_to_the_repositorys_host_only(
    eager: None, django_capture_on_commit_callbacks: Any, http_git: GitHTTP, served: Path, upstream: Upstream
) -> None:
    # A submodule on another server (another port: another origin) that would accept the same
    # token: git must not offer it there, so the submodule cannot be fetched.
    elsewhere = GitHTTP(served, HTTP_USER, HTTP_TOKEN).start()
    try:
        # Added from disk (the test's own git needs no token), then pointed at the other host.
        work = upstream.work
        git(
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "--quiet",
            "add",
            str(upstream.bare),
            "vendor/self",
            cwd=work,
        )
        git("config", "-f", ".gitmodules", "submodule.vendor/self.url", elsewhere.url(upstream), cwd=work)
        upstream.commit("a submodule on another host", {})
        secret_create(name=SECRET, value=HTTP_TOKEN)
        record = declare(
            django_capture_on_commit_callbacks,
            "sub",
            repository=http_git.url(upstream),
            auth={"$secret": SECRET},
            username=HTTP_USER,
            submodules=True,
        )
        assert record.phase == Phase.CREATE_FAILED
        assert f"127.0.0.1:{elsewhere.port}" in record.last_error  # the submodule's fetch failed
        assert any(ok for _m, _p, ok in http_git.requests)
        assert elsewhere.requests, "the submodule was tried"
        assert not any(ok for _m, _p, ok in elsewhere.requests), "the other host never got the token"
        assert tables_containing(HTTP_TOKEN) == []
    finally:
        elsewhere.stop()
