"""Git actions (not resources): list a remote's refs, tag, commit and push.

``graphene_sdk.libs.git`` runs these inside ``ctx.step`` on the worker, so each is journaled
and, on replay, returns its recorded result instead of acting again. A step is at least
once: after a crash it may run a second time, so every action here converges — an existing
tag on the same commit, a commit with nothing left to commit, a push of what the remote
already has are all successes.

``auth`` is a secret *name*: its value is read from the secret store here, at the point of
use, and reaches git only through its environment (``kinds.git.cli``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kinds.git import cli
from kinds.git.auth import credentials

# Who commits and tags when the server's git has no identity configured.
FALLBACK_NAME = "Graphene"
FALLBACK_EMAIL = "graphene@localhost"


def _repository(checkout_path: str) -> Path:
    path = Path(checkout_path).resolve()
    if not (path / ".git").exists():
        raise cli.GitError(f"{path} is not a git checkout (no .git in it)", permanent=True)
    return path


def _identity(path: Path) -> list[str]:
    """``-c user.name/-c user.email`` for what the configuration lacks (values, not secrets)."""
    args: list[str] = []
    for key, fallback in (("user.name", FALLBACK_NAME), ("user.email", FALLBACK_EMAIL)):
        if not cli.run(["config", "--get", key], cwd=path, check=False).stdout.strip():
            args += ["-c", f"{key}={fallback}"]
    return args


def _origin(path: Path) -> str:
    url = cli.run(["config", "--get", "remote.origin.url"], cwd=path, check=False).stdout.strip()
    if not url:
        raise cli.GitError(f"{path} has no remote 'origin' to push to", permanent=True)
    return url


def ls_remote(repository: str, auth: str | None = None, username: str | None = None) -> dict[str, str]:
    """Every ref of ``repository`` (``refs/heads/main``, ``refs/tags/v1``, ``HEAD``...) -> sha."""
    if cli.url_has_credentials(repository):
        raise cli.GitError("the repository URL carries credentials; pass them as auth (a secret name)", permanent=True)
    if repository.startswith("-"):
        raise cli.GitError("a repository URL does not start with '-'", permanent=True)
    return cli.ls_remote(repository, credentials(auth, username))


def tag(
    checkout_path: str,
    name: str,
    message: str | None = None,
    push: bool = True,
    auth: str | None = None,
    username: str | None = None,
) -> dict[str, Any]:
    """Tag HEAD as ``name`` (annotated with ``message``), and push the tag to origin.

    A tag that exists on HEAD already is kept (a re-run after a crash); on another commit it
    is an error — tags are not moved.
    """
    path = _repository(checkout_path)
    if not name or name.startswith("-") or cli.run(["check-ref-format", f"refs/tags/{name}"], check=False).returncode:
        raise cli.GitError(f"{name!r} is not a valid tag name", permanent=True)
    head = cli.rev_parse(path, "HEAD")
    if head is None:
        raise cli.GitError(f"{path} has no commit to tag", permanent=True)
    existing = cli.rev_parse(path, f"refs/tags/{name}")
    if existing is None:
        annotate = ["-a", "-m", message] if message is not None else []
        cli.run([*_identity(path), "tag", *annotate, "--", name, head], cwd=path)
    elif existing != head:
        raise cli.GitError(f"tag {name!r} already exists on {existing}, not on HEAD {head}", permanent=True)
    pushed = False
    if push:
        url = _origin(path)
        creds = credentials(auth, username)
        cli.run(
            ["push", "--quiet", "origin", f"refs/tags/{name}:refs/tags/{name}"],
            cwd=path,
            url=url,
            credentials=creds,
            timeout=cli.NETWORK_TIMEOUT,
        )
        pushed = True
    return {"tag": name, "commit": head, "pushed": pushed}


def commit(
    checkout_path: str,
    message: str,
    paths: list[str] | None = None,
    push: bool = True,
    auth: str | None = None,
    username: str | None = None,
    branch: str | None = None,
) -> dict[str, Any]:
    """Commit ``paths`` (default: every change, new files included) and push to origin's branch.

    The branch is ``branch`` or the one checked out (a ``git.checkout`` of a branch checks out
    a local branch of that name). Nothing to commit is not an error: HEAD is pushed as it is,
    so a re-run after a crash between commit and push finishes the push.
    """
    path = _repository(checkout_path)
    if not message.strip():
        raise cli.GitError("a commit needs a message", permanent=True)
    if paths:
        cli.run(["add", "--all", "--", *paths], cwd=path)
    else:
        cli.run(["add", "--all"], cwd=path)
    staged = cli.run(["diff", "--cached", "--quiet"], cwd=path, check=False).returncode != 0
    if staged:
        cli.run([*_identity(path), "commit", "--quiet", "--no-verify", "-m", message], cwd=path)
    head = cli.rev_parse(path, "HEAD")
    if head is None:
        raise cli.GitError(f"{path} has nothing to commit and no commit yet", permanent=True)
    target = branch or cli.run(["symbolic-ref", "--quiet", "--short", "HEAD"], cwd=path, check=False).stdout.strip()
    pushed = False
    if push:
        if not target:
            raise cli.GitError(
                f"{path} is not on a branch (a tag or a commit was checked out); pass branch= to push", permanent=True
            )
        if target.startswith("-"):
            raise cli.GitError(f"{target!r} is not a branch name", permanent=True)
        url = _origin(path)
        cli.run(
            ["push", "--quiet", "origin", f"HEAD:refs/heads/{target}"],
            cwd=path,
            url=url,
            credentials=credentials(auth, username),
            timeout=cli.NETWORK_TIMEOUT,
        )
        cli.run(["update-ref", f"refs/remotes/origin/{target}", head], cwd=path)
        pushed = True
    return {"commit": head, "committed": staged, "branch": target or None, "pushed": pushed}
