"""The ``git.checkout`` kind: a working tree of a repository at a ref, in a directory on the server.

Marker (I4): the file ``.git/graphene-record`` holding the record id. A directory at the path
without it (or with another record's id) is a stranger's: never adopted, never deleted.

Create is adopt-or-create and converges either way:

1. A new checkout is built in a sibling ``.<name>.graphene-<record id>`` (ours by its name):
   ``git init``, the marker, then an atomic rename to the path. A crash before the rename
   leaves only that sibling, which the retry removes; after it, a marked directory the retry
   adopts. There is never an unmarked directory of ours at the path.
2. In the marked directory: set ``origin`` to the repository, ``git fetch`` the ref (shallow
   with ``depth``), resolve it to a commit, compare with ``expected_commit`` (a mismatch is a
   permanent error naming both, before the working tree is touched), check it out with
   ``--force`` (tracked changes are discarded; untracked files stay), update submodules.

A branch is checked out as a local branch of the same name (so ``graphene_sdk.libs.git.commit``
can push to it); a tag, a commit or ``HEAD`` is checked out detached.

Drift: ``observe`` reads HEAD and whether tracked files differ from it (no network); ``diff``
reports a HEAD other than the commit the record converged to, or a dirty tree. A branch
that moves upstream is *not* drift: a checkout is the ref as it was when it converged. A
heal re-runs create, which restores that commit (the ref is resolved again only by a new
generation of the spec, or before the first convergence).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from kinds import Drift, Kind, KindError, Marked, Observed, PermanentError
from kinds.git import cli
from kinds.git.auth import credentials

if TYPE_CHECKING:
    from apps.records.models import Record

MARKER = "graphene-record"  # in the .git directory
TMP_INFIX = ".graphene-"
# A repository URL must not carry a password (or, for http(s), any user part): credentials
# go in ``auth`` (a secret name), never in a spec. No leading '-' (never an option to git).
URL_PATTERN = r"^(?!-)(?![A-Za-z][A-Za-z0-9+.-]*://[^/@]*:[^/@]*@)(?!https?://[^/@]*@)\S+$"
REF_PATTERN = r"^(?!-)[^\s~^:?*\[\\]+$"


def root() -> Path:
    """Where checkouts live: ``GRAPHENE_DATA_DIR/checkouts``."""
    return (Path(settings.DATA_DIR) / "checkouts").resolve()


def target_path(record: Record) -> Path:
    """The checkout's directory: ``path`` under the checkouts root, or ``<root>/<record id>``."""
    base = root()
    path = record.spec.get("path")
    if not path:
        return base / str(record.id)
    target = (base / path).resolve()
    if target == base or base not in target.parents:
        raise PermanentError(f"path {path!r} must name a directory under the checkouts root {base}")
    return target


def tmp_path(target: Path, record_id: str) -> Path:
    return target.with_name(f".{target.name}{TMP_INFIX}{record_id}")


def read_marker(target: Path) -> str | None:
    try:
        return (target / ".git" / MARKER).read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def _remove_tree(path: Path) -> None:
    """Remove a file or directory tree (a symlink itself, never what it points to)."""
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return
    shutil.rmtree(path)


def converged_to(record: Record) -> tuple[str, str | None] | None:
    """The commit (and local branch) this generation of the record converged to, if it did."""
    outputs = record.outputs or {}
    if record.observed_generation == record.generation and outputs.get("commit"):
        return str(outputs["commit"]), outputs.get("branch")
    return None


def _kind_error(exc: cli.GitError) -> KindError:
    return PermanentError(str(exc)) if exc.permanent else KindError(str(exc))


def _fetched(git_dir: Path) -> tuple[str, str | None]:
    """The object ``git fetch`` got for the one ref it was given, and the branch name if the
    ref was a branch (from ``FETCH_HEAD``: ``<sha>\\t<flag>\\tbranch 'main' of <url>``)."""
    lines = [line for line in (git_dir / "FETCH_HEAD").read_text().splitlines() if line.strip()]
    if not lines:
        raise KindError("git fetch wrote no FETCH_HEAD")
    sha, _flag, description = [*lines[0].split("\t"), "", ""][:3]
    branch = None
    if description.startswith("branch '"):
        branch = description[len("branch '") :].rsplit("' of ", 1)[0]
    return sha, branch


class CheckoutKind(Kind):
    name = "git.checkout"
    description = (
        "A git working tree on the Graphene server (under GRAPHENE_DATA_DIR/checkouts) at a branch, tag or "
        "commit, optionally pinned to an expected commit, shallow, with submodules; marked .git/graphene-record."
    )
    drift_interval = timedelta(seconds=60)
    spec_schema = {
        "type": "object",
        "properties": {
            "repository": {
                "type": "string",
                "minLength": 1,
                "pattern": URL_PATTERN,
                "description": "clone URL (https://, git://, ssh://, file://); no credentials in it: use auth",
            },
            "ref": {
                "type": "string",
                "minLength": 1,
                "pattern": REF_PATTERN,
                "default": "HEAD",
                "description": "branch, tag, full ref name, commit sha or HEAD (the remote's default branch)",
            },
            "expected_commit": {
                "type": "string",
                "pattern": "^([0-9a-f]{40}|[0-9a-f]{64})$",
                "description": "the full sha the ref must resolve to; another one fails the record",
            },
            "depth": {"type": "integer", "minimum": 1, "description": "shallow fetch of this many commits"},
            "submodules": {"type": "boolean", "default": False, "description": "check out submodules, recursively"},
            "path": {
                "type": "string",
                "minLength": 1,
                "description": "directory relative to the checkouts root (default: the record id)",
            },
            "auth": {
                "type": "object",
                "properties": {"$secret": {"type": "string", "minLength": 1}},
                "required": ["$secret"],
                "additionalProperties": False,
                "description": "a token or password for http(s), by secret name: ctx.secret('name')",
            },
            "username": {
                "type": "string",
                "minLength": 1,
                "description": f"the user name sent with auth (default {cli.DEFAULT_USERNAME})",
            },
        },
        "required": ["repository"],
        "additionalProperties": False,
    }

    # --- create: adopt-or-create ---------------------------------------------------------------

    def create(self, record: Record) -> dict[str, Any]:
        spec = record.spec
        record_id = str(record.id)
        target = target_path(record)
        url = str(spec["repository"])
        if cli.url_has_credentials(url):  # the schema refuses these; a spec from before it did not
            raise PermanentError("the repository URL carries credentials; pass them as auth (a secret name)")
        adopted = target.exists() or target.is_symlink()
        if adopted:
            owner = read_marker(target) if target.is_dir() and not target.is_symlink() else None
            if owner != record_id:
                whose = f"record {owner}" if owner else "no Graphene record"
                raise PermanentError(f"{target} already exists and belongs to {whose}; refusing to adopt it")
        try:
            creds = credentials(spec.get("auth"), spec.get("username"))
            if creds is not None:
                cli.credential_scope(url)  # auth for a URL that cannot use it: fail before touching disk
            if not adopted:
                self._init(target, record_id)
            outputs = self._converge(target, spec, creds, converged_to(record))
        except cli.GitError as exc:
            raise _kind_error(exc) from None
        self._remove_moved(record, target)
        return {**outputs, "adopted": adopted}

    def _remove_moved(self, record: Record, target: Path) -> None:
        """A new generation with another ``path``: the previous directory (ours) goes."""
        previous = (record.outputs or {}).get("path")
        if previous and Path(previous) != target:
            self._remove(Path(previous), str(record.id))

    def _init(self, target: Path, record_id: str) -> None:
        """An empty marked repository at ``target``, made aside and renamed into place."""
        tmp = tmp_path(target, record_id)
        _remove_tree(tmp)  # a crashed attempt of ours
        target.parent.mkdir(parents=True, exist_ok=True)
        cli.run(["init", "--quiet", str(tmp)])
        (tmp / ".git" / MARKER).write_text(record_id + "\n")
        if target.exists():  # appeared since we looked: a stranger's after all
            _remove_tree(tmp)
            raise PermanentError(f"{target} appeared while the checkout was being made; refusing to adopt it")
        os.rename(tmp, target)

    def _converge(
        self,
        target: Path,
        spec: dict[str, Any],
        creds: cli.Credentials | None,
        converged: tuple[str, str | None] | None,
    ) -> dict[str, Any]:
        url = str(spec["repository"])
        ref = str(spec.get("ref") or "HEAD")
        depth = spec.get("depth")
        expected = spec.get("expected_commit")

        def remote(args: list[str]) -> None:
            cli.run(args, cwd=target, url=url, credentials=creds, timeout=cli.NETWORK_TIMEOUT)

        cli.run(["config", "remote.origin.url", url], cwd=target)
        fetch = ["fetch", "--quiet", "--no-tags"]  # the ref itself, resolved through FETCH_HEAD below
        if depth:
            fetch.append(f"--depth={int(depth)}")
        if converged is not None:
            # A heal: back to the commit this generation converged to (what drift is measured
            # against), not to wherever the ref points now. Fetched only if it is not here
            # (the directory was gone): by sha, else through the ref, which may still reach it.
            commit, branch = converged
            if cli.rev_parse(target, commit) is None:
                try:
                    remote([*fetch, "origin", commit])
                except cli.GitError:
                    remote([*fetch, "origin", ref])
            if cli.rev_parse(target, commit) is None:
                raise PermanentError(f"commit {commit} (the checkout's) can no longer be fetched from {url}")
        else:
            remote([*fetch, "origin", ref])
            fetched, branch = _fetched(target / ".git")
            resolved = cli.rev_parse(target, fetched)
            if resolved is None:
                raise PermanentError(f"ref {ref!r} of {url} names {fetched}, which is not a commit")
            commit = resolved
        if expected and commit != expected:
            raise PermanentError(
                f"ref {ref!r} of {url} resolved to {commit}, not the expected commit {expected}; "
                "the working tree was left as it was"
            )
        if branch:
            # A local branch of the same name, tracking origin's: a commit can be pushed back.
            cli.run(["checkout", "--quiet", "--force", "-B", branch, commit], cwd=target)
            cli.run(["config", f"branch.{branch}.remote", "origin"], cwd=target)
            cli.run(["config", f"branch.{branch}.merge", f"refs/heads/{branch}"], cwd=target)
            cli.run(["update-ref", f"refs/remotes/origin/{branch}", commit], cwd=target)
        else:
            cli.run(["checkout", "--quiet", "--force", "--detach", commit], cwd=target)
        if spec.get("submodules"):
            cli.run(["submodule", "sync", "--quiet", "--recursive"], cwd=target)
            remote(["submodule", "update", "--init", "--recursive", "--force", "--quiet"])
        head = cli.rev_parse(target, "HEAD")
        return {"path": str(target), "commit": head, "ref": ref, "branch": branch}

    # --- observe and diff ----------------------------------------------------------------------

    def observe(self, record: Record) -> Observed | None:
        target = self._own_path(record)
        if target is None:
            return None
        try:
            head = cli.rev_parse(target, "HEAD")
            status = cli.run(["status", "--porcelain", "--untracked-files=no"], cwd=target)
        except cli.GitError as exc:
            raise _kind_error(exc) from None
        return Observed(
            {
                "path": str(target),
                "commit": head,
                "ref": record.spec.get("ref") or "HEAD",
                "dirty": bool(status.stdout.strip()),
            }
        )

    def diff(self, record: Record, observed: Observed) -> list[Drift]:
        want = record.outputs.get("commit") or record.spec.get("expected_commit")
        drifts = []
        if want and observed.outputs.get("commit") != want:
            drifts.append(Drift("commit", want, observed.outputs.get("commit")))
        if observed.outputs.get("dirty"):
            drifts.append(Drift("dirty", False, True))
        return drifts

    def _own_path(self, record: Record) -> Path | None:
        """The checkout's directory if it exists and carries this record's marker."""
        try:
            target = target_path(record)
        except PermanentError:
            return None  # an invalid path never produced a directory
        if target.is_symlink() or not target.is_dir() or read_marker(target) != str(record.id):
            return None
        return target

    # --- delete and sweep ----------------------------------------------------------------------

    def delete(self, record: Record) -> None:
        previous = (record.outputs or {}).get("path")
        if previous:  # where it converged last (a later generation may name another path)
            self._remove(Path(previous), str(record.id))
        try:
            target = target_path(record)
        except PermanentError:
            return  # an invalid path never produced a directory
        self._remove(target, str(record.id))

    def _remove(self, target: Path, record_id: str) -> None:
        aside = tmp_path(target, record_id)
        if not target.is_symlink() and target.is_dir() and read_marker(target) == record_id:
            # Renamed aside (ours by name) first: a crash midway leaves no unmarked remains at
            # the path, and the retry (or the sweeper) finds the aside directory by its name.
            _remove_tree(aside)
            os.rename(target, aside)
        _remove_tree(aside)

    def sweep(self) -> Iterable[Marked]:
        base = root()
        if not base.is_dir():
            return
        for dirpath, dirnames, _files in os.walk(base):
            here = Path(dirpath)
            for dirname in list(dirnames):
                path = here / dirname
                marker = read_marker(path)
                if TMP_INFIX in dirname and dirname.startswith("."):
                    # Left by a crash mid-create or mid-delete: ours by its name.
                    yield Marked(external_id=str(path), record_id=dirname.rsplit(TMP_INFIX, 1)[1])
                    dirnames.remove(dirname)
                elif marker:
                    yield Marked(external_id=str(path), record_id=marker)
                    dirnames.remove(dirname)  # never look inside a checkout
                elif (path / ".git").exists():
                    dirnames.remove(dirname)  # a stranger's repository: not ours to look into

    def delete_external(self, external_id: str) -> None:
        path = Path(external_id)
        name = path.name
        if TMP_INFIX in name and name.startswith("."):
            with contextlib.suppress(FileNotFoundError):
                _remove_tree(path)
            return
        marker = read_marker(path)
        if marker:
            self._remove(path, marker)
