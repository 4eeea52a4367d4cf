"""Git for pipelines: a checkout as a resource, and ls-remote, tag and commit as journaled steps.

::

    from graphene_sdk.libs import git

    co = git.checkout(ctx, "src", repository="https://git.example.com/app.git", ref="main",
                      auth=ctx.secret("git-token"), depth=1)
    path = co.ready()["path"]                       # the directory on the Graphene server
    refs = git.ls_remote(ctx, "https://git.example.com/app.git", auth=ctx.secret("git-token"))
    git.tag(ctx, path, "v1.2.0", message="release", auth=ctx.secret("git-token"))

``checkout`` declares a ``git.checkout`` record (see ``kinds/git/README.md``): a directory
on the Graphene server or, with ``on=agent``, on that agent's machine, owned by the run (or
the declared agent) like any resource and deleted with it. The actions
run ``git`` on the worker inside ``ctx.step``: each is journaled, and a replay returns the
recorded result without running git again. Steps are at least once, and the actions are
written to converge when repeated (an existing tag on the same commit, nothing left to
commit, a push the remote already has).

``auth`` is always ``ctx.secret("name")``: only the name enters the spec, the journal and
the logs; the value is read on the server when git needs it and handed to git through its
environment, never its command line or a file.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal
from urllib.parse import urlsplit

from graphene_sdk._context import Context
from graphene_sdk._handles import Agent, AttachedAgent, Resource
from graphene_sdk._runtime import DriftPolicy
from graphene_sdk._secrets import SecretRef

__all__ = ["checkout", "commit", "ls_remote", "tag"]

KIND = "git.checkout"
SERVER: Literal["server"] = "server"


def _check_repository(repository: str) -> None:
    # Refused before anything is declared or journaled: the message must not echo the URL.
    if not isinstance(repository, str) or not repository.strip():
        raise ValueError("repository must be a clone URL (https://, git://, ssh://, file://)")
    if repository.startswith("-") or any(c.isspace() for c in repository):
        raise ValueError("repository must be a clone URL without spaces, not starting with '-'")
    if "://" in repository:
        parts = urlsplit(repository)
        if parts.password is not None or (parts.scheme in ("http", "https") and parts.username is not None):
            raise ValueError(
                "repository must not carry credentials (user:token@...); pass auth=ctx.secret('<name>') instead"
            )


def _secret_name(auth: SecretRef | None) -> str | None:
    if auth is None:
        return None
    if not isinstance(auth, SecretRef):
        raise TypeError("auth must be ctx.secret('<name>'): a token or password is stored in Graphene, never passed")
    return auth.name


def checkout(
    ctx: Context,
    name: str,
    *,
    repository: str,
    ref: str = "HEAD",
    expected_commit: str | None = None,
    depth: int | None = None,
    submodules: bool = False,
    path: str | None = None,
    auth: SecretRef | None = None,
    username: str | None = None,
    on: Agent | AttachedAgent | Literal["server"] = SERVER,
    parent: Resource | None = None,
    reconcile_every: timedelta | float | None = None,
    on_drift: DriftPolicy | None = None,
    protect: bool = False,
) -> Resource:
    """Declare a working tree of ``repository`` at ``ref`` on the Graphene server or, with
    ``on=agent``, on that agent's machine.

    ``ref`` is a branch, a tag, a full ref name, a commit sha or ``HEAD`` (the remote's
    default branch). ``expected_commit`` pins it: a ref that resolves to another commit fails
    the record, naming both. ``depth`` fetches shallowly; ``submodules`` checks them out too.
    ``path`` is relative to the server's checkouts root (default: the record's id); on an
    agent's machine it is an absolute directory there, and required. A checkout on a machine
    this run declared (``ctx.agent``) is owned by the agent's record unless ``parent`` says
    otherwise, so it is removed before the agent goes. The agent runs git itself (the machine
    needs git >= 2.31); ``auth``'s value travels to it in a sealed (encrypted) command.

    Ready outputs: ``path``, ``commit`` (the sha checked out), ``ref``, ``branch`` (the local
    branch for a branch ref, else ``None``). The checkout is observed every minute (or
    ``reconcile_every``): a HEAD other than ``commit`` or changed tracked files are drift,
    healed by checking ``commit`` out again (a branch that moved upstream is not drift; a new
    spec moves the checkout) — pass ``on_drift="report"`` for a checkout your steps modify or
    commit to. ``protect=True`` declares it protected: a deletion that reaches it stops there
    until it is unprotected (see ``ctx.declare``).
    """
    _check_repository(repository)
    if not isinstance(on, Agent | AttachedAgent) and on != SERVER:
        raise ValueError(f"on is 'server' or an agent handle (ctx.agent, ctx.attach_agent...), not {on!r}")
    if isinstance(on, Agent | AttachedAgent) and (not isinstance(path, str) or not path.startswith("/")):
        raise ValueError(f"a checkout on an agent's machine needs an absolute path (e.g. /srv/build/src), not {path!r}")
    if not isinstance(ref, str) or not ref or ref.startswith("-") or any(c.isspace() for c in ref):
        raise ValueError(f"ref must be a branch, tag, commit or HEAD, got {ref!r}")
    spec: dict[str, Any] = {"repository": repository, "ref": ref, "submodules": bool(submodules)}
    if expected_commit is not None:
        spec["expected_commit"] = expected_commit
    if depth is not None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, got {depth!r}")
        spec["depth"] = depth
    if path is not None:
        spec["path"] = path
    secret = _secret_name(auth)
    if auth is not None:
        spec["auth"] = auth
    if username is not None:
        if secret is None:
            raise ValueError("username is sent with auth; pass auth=ctx.secret('<name>') too")
        spec["username"] = username
    if isinstance(on, Agent | AttachedAgent):
        spec["agent"] = on.id
        if isinstance(on, Agent) and parent is None:
            parent = on  # removed before the agent goes (an attached agent is not this run's)
    options: dict[str, Any] = {}
    # Only when given: the declaration's own defaults apply otherwise.
    if reconcile_every is not None:
        options["reconcile_every"] = reconcile_every
    if on_drift is not None:
        options["on_drift"] = on_drift
    if protect:  # a deletion stops at it (docs/records.md, "Protected records")
        options["protect"] = True
    return ctx.declare(KIND, name, spec, parent=parent, **options)


def _actions() -> Any:
    # The actions run where the step runs: on a Graphene worker, which has the server's
    # ``kinds`` package (and its secret store). Loaded by name so that this module, which
    # pipeline authors type-check against, does not depend on the server's code.
    return importlib.import_module("kinds.git.actions")


def _ls_remote(repository: str, auth: str | None, username: str | None) -> dict[str, str]:
    result: dict[str, str] = _actions().ls_remote(repository, auth, username)
    return result


def _tag(
    checkout_path: str, name: str, message: str | None, push: bool, auth: str | None, username: str | None
) -> dict[str, Any]:
    result: dict[str, Any] = _actions().tag(checkout_path, name, message, push, auth, username)
    return result


def _commit(
    checkout_path: str,
    message: str,
    paths: list[str] | None,
    push: bool,
    auth: str | None,
    username: str | None,
    branch: str | None,
) -> dict[str, Any]:
    result: dict[str, Any] = _actions().commit(checkout_path, message, paths, push, auth, username, branch)
    return result


def ls_remote(
    ctx: Context, repository: str, *, auth: SecretRef | None = None, username: str | None = None
) -> dict[str, str]:
    """The remote's refs (``HEAD``, ``refs/heads/main``, ``refs/tags/v1``, ``refs/tags/v1^{}``...) -> sha.

    A journaled step (``git.ls_remote``): a replay returns the refs as they were then.
    """
    _check_repository(repository)
    result: dict[str, str] = ctx.step("git.ls_remote", _ls_remote, repository, _secret_name(auth), username)
    return result


def tag(
    ctx: Context,
    checkout_path: str,
    name: str,
    *,
    message: str | None = None,
    push: bool = True,
    auth: SecretRef | None = None,
    username: str | None = None,
) -> dict[str, Any]:
    """Tag the checkout's HEAD (annotated if ``message``) and push the tag to its origin.

    Returns ``{"tag", "commit", "pushed"}``. A journaled step (``git.tag <name>``); a tag that
    already exists on another commit fails it (tags are not moved).
    """
    result: dict[str, Any] = ctx.step(
        f"git.tag {name}", _tag, str(checkout_path), name, message, push, _secret_name(auth), username
    )
    return result


def commit(
    ctx: Context,
    checkout_path: str,
    message: str,
    *,
    paths: Sequence[str] | None = None,
    push: bool = True,
    auth: SecretRef | None = None,
    username: str | None = None,
    branch: str | None = None,
) -> dict[str, Any]:
    """Commit ``paths`` (default: all changes, new files included) and push to origin.

    It pushes to ``branch``, or to the branch checked out (a checkout of a branch ref is on a
    local branch of that name). Returns ``{"commit", "committed", "branch", "pushed"}``;
    nothing to commit is not an error. A journaled step (``git.commit``).

    The commit moves the checkout's HEAD: a ``git.checkout`` record reports that as drift at
    its next observation (declare it with ``on_drift="report"`` if you commit to it).
    """
    if isinstance(paths, str):
        raise TypeError("paths is a list of paths, e.g. ['VERSION']")
    listed = [str(p) for p in paths] if paths is not None else None
    result: dict[str, Any] = ctx.step(
        "git.commit", _commit, str(checkout_path), message, listed, push, _secret_name(auth), username, branch
    )
    return result
