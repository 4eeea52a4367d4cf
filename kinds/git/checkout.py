"""The ``git.checkout`` kind: a working tree of a repository at a ref, in a directory on the
server or on an agent's machine (``agent`` in the spec: an absolute ``path`` there).

What is done to the directory is ``kinds.git._checkout_op.checkout_op``, one self-contained
function: called here for the server's checkouts, run on the machine for an agent's
(``kinds.machine``; *sealed* when it carries a credential). This module decides where
(the path), with what (the spec, the secret's value, the commit a heal returns to) and maps
the function's errors to ``PermanentError`` / ``KindError``.

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
from kinds.git._checkout_op import checkout_op
from kinds.git.auth import credentials
from kinds.machine import Abandoned, Call, machines

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


def machine_path(record: Record) -> str:
    """The checkout's directory on its agent's machine: ``path``, absolute and normalized."""
    path = str(record.spec.get("path") or "")
    if not path.startswith("/"):
        raise PermanentError(
            f"a checkout on an agent's machine needs an absolute path (e.g. /srv/build/src), not {path!r}"
        )
    normal = os.path.normpath(path)
    if normal == "/":
        raise PermanentError("path must name a directory for the checkout, not /")
    return normal


def tmp_path(target: Path, record_id: str) -> Path:
    return target.with_name(f".{target.name}{TMP_INFIX}{record_id}")


def read_marker(target: Path) -> str | None:
    found = checkout_op("marker", str(target), "")
    return str(found["record"]) if found else None


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


def _previous(record: Record, agent_id: str | None) -> str:
    """Where an earlier generation converged, if on the same machine (else ``""``)."""
    outputs = record.outputs or {}
    if (outputs.get("agent") or None) != (agent_id or None):
        return ""  # another machine's: removed there before this create (Kind.placement)
    return str(outputs.get("path") or "")


def _local(op: str, path: str, record_id: str, options: dict[str, Any] | None = None, password: str = "") -> Any:
    """``checkout_op`` in this process, its errors as the kind's."""
    try:
        return checkout_op(op, path, record_id, options, password)
    except (ValueError, FileExistsError) as exc:
        raise PermanentError(str(exc)) from None
    except RuntimeError as exc:
        raise KindError(str(exc)) from None


class CheckoutKind(Kind):
    name = "git.checkout"
    # To another machine, the records service removes it from the first (a new path on the
    # same machine is this kind's own move: ``_previous``).
    placement = ("agent",)
    description = (
        "A git working tree at a branch, tag or commit, on the Graphene server (under "
        "GRAPHENE_DATA_DIR/checkouts) or on an agent's machine, optionally pinned to an expected commit, "
        "shallow, with submodules; marked .git/graphene-record."
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
                "description": (
                    "on the server: a directory relative to the checkouts root (default: the record id); "
                    "on an agent's machine: an absolute directory (required)"
                ),
            },
            "agent": {
                "type": "string",
                "format": "uuid",
                "description": "the agent record whose machine holds the checkout (absent: the server)",
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
        agent_id = spec.get("agent")
        target = machine_path(record) if agent_id else str(target_path(record))
        url = str(spec["repository"])
        if cli.url_has_credentials(url):  # the schema refuses these; a spec from before it did not
            raise PermanentError("the repository URL carries credentials; pass them as auth (a secret name)")
        try:
            # Read here, at the point of use (I7); a missing secret or auth for a URL that cannot
            # use it fails before anything is touched.
            creds = credentials(spec.get("auth"), spec.get("username"), namespace=record.namespace)
            if creds is not None:
                cli.credential_scope(url)
        except cli.GitError as exc:
            raise (PermanentError(str(exc)) if exc.permanent else KindError(str(exc))) from None
        converged = converged_to(record)
        options = {
            "repository": url,
            "ref": str(spec.get("ref") or "HEAD"),
            "depth": spec.get("depth"),
            "expected_commit": spec.get("expected_commit"),
            "submodules": bool(spec.get("submodules")),
            "username": creds.username if creds is not None else None,
            "converged": list(converged) if converged is not None else None,
            "previous": _previous(record, agent_id),
        }
        args: list[Any] = ["create", target, str(record.id), options, creds.password if creds is not None else ""]
        if agent_id:
            # The arguments carry the secret's value: the command is stored sealed (I7).
            outputs = machines().run(record, agent_id, "create", Call(checkout_op, args, sealed=creds is not None))
            return {**outputs, "agent": agent_id}
        outputs = _local(*args)
        assert outputs is not None
        return dict(outputs)

    # --- observe and diff ----------------------------------------------------------------------

    def observe(self, record: Record) -> Observed | None:
        agent_id = record.spec.get("agent")
        ref = record.spec.get("ref") or "HEAD"
        if agent_id:
            try:
                target = machine_path(record)
            except PermanentError:
                return None  # an invalid path never produced a directory
            found = machines().observe(record, agent_id, Call(checkout_op, ["observe", target, str(record.id)]))
            return None if found is None else Observed({**found, "ref": ref, "agent": agent_id})
        try:
            path = target_path(record)
        except PermanentError:
            return None  # an invalid path never produced a directory
        found = _local("observe", str(path), str(record.id))
        return None if found is None else Observed({**found, "ref": ref})

    def diff(self, record: Record, observed: Observed) -> list[Drift]:
        want = record.outputs.get("commit") or record.spec.get("expected_commit")
        drifts = []
        if want and observed.outputs.get("commit") != want:
            drifts.append(Drift("commit", want, observed.outputs.get("commit")))
        if observed.outputs.get("dirty"):
            drifts.append(Drift("dirty", False, True))
        return drifts

    # --- delete and sweep ----------------------------------------------------------------------

    def delete(self, record: Record) -> None:
        # Where it converged last (a later generation may name another path) and where it is.
        agent_id = record.spec.get("agent")
        previous = _previous(record, agent_id)
        try:
            target = machine_path(record) if agent_id else str(target_path(record))
        except PermanentError:
            target = ""  # an invalid path never produced a directory
        if not target and not previous:
            return
        args: list[Any] = ["remove", target, str(record.id), {"previous": previous}]
        if not agent_id:
            _local(*args)
            return
        try:
            machines().run(record, agent_id, "remove", Call(checkout_op, args), deleting=True)
        except Abandoned as exc:
            machines().abandon(record, exc, left=f"the checkout {target or previous}")

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
            _local("remove", str(path), marker)
