"""Git sources: what commit a ref names now, and the files of a commit's tree, written as plain files.

A source is a repository URL, a ref (a branch, a tag or a commit sha), a sub-directory and an
optional credential. ``resolve`` pins a source to a commit; ``export`` writes that commit's
tree (or one sub-directory of it) into an empty directory, which becomes a revision.

No Django here: git runs through ``kinds.git.cli``, so credentials reach git through its
environment only (never argv, disk or logs), no hook runs, git never prompts, and what git
prints is redacted before it can reach a message. Every failure is a ``SourceError`` whose
``detail`` says what went wrong and what to do, and whose ``code`` tells the kinds apart.

``export`` fetches only the commit (``--depth 1`` into a temporary bare repository, removed
afterwards) and checks everything it can before it writes: the sub-directory is there, the
files fit in ``max_bytes`` (sizes from ``git ls-tree -l``), no path or symlink leads outside
the tree. Then it writes the blobs themselves (``git cat-file --batch``) rather than using
``git archive`` or ``checkout-index``: those apply ``.gitattributes`` conversions and the
worker's own filter drivers (an LFS smudge filter in the machine's configuration, eol
settings), so the files would depend on the worker instead of being the commit's bytes, and
``checkout-index`` leaves an empty directory for each submodule. Here a revision holds exactly
the tree's blobs with their executable bits, and symlinks that stay inside it. Submodules are
neither fetched nor represented.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import kinds.git.cli as cli
from kinds.git.cli import Credentials

__all__ = [
    "SCHEMES",
    "Credentials",
    "SourceError",
    "check_ref",
    "check_subdirectory",
    "check_url",
    "export",
    "resolve",
    "token_credentials",
]

SCHEMES = ("http", "https", "git", "file", "ssh")

_SHA = re.compile(r"[0-9a-fA-F]{40}")
_ABBREVIATED_SHA = re.compile(r"[0-9a-fA-F]{4,39}")
_REFS_SHOWN = 10  # branches (and tags) named in a "ref not found" message
_BATCH_BYTES = 32 * 1024 * 1024  # blob bytes read from one ``cat-file --batch``: bounds memory
_SYMLINK_HOPS = 40  # as the kernel's ELOOP limit: a longer chain is a loop, which leads nowhere

_REGULAR = {"100644": 0o644, "100755": 0o755}
_SYMLINK = "120000"
_GITLINK = "160000"  # a submodule's commit: ignored

# git's messages (lower case), by what they mean for the user.
_NO_CREDENTIAL = ("terminal prompts disabled", "could not read username", "could not read password")
_REFUSED = ("authentication failed", "invalid username or password", "returned error: 403", "http basic: access denied")
_NO_COMMIT = ("not our ref", "couldn't find remote ref", "no such remote ref")
_NO_REPOSITORY = (
    "does not appear to be a git repository",
    "repository not found",
    "no such repository",
    "not exported",
    "not found: did you run git update-server-info",
    "returned error: 404",
)
_NO_REPOSITORY_HTTP = re.compile(r"repository '[^']*' not found")  # smart HTTP's 404
_NO_CONNECTION = (
    "connection refused",
    "couldn't connect",
    "could not resolve host",
    "unable to look up",
    "name or service not known",
    "failed to connect",
    "unable to connect",
    "unable to access",
    "no route to host",
    "network is unreachable",
    "connection timed out",
    "could not read from remote repository",
)
# Lines git adds after the cause, which say nothing about it.
_NOISE = ("could not read from remote repository", "please make sure you have the correct", "and the repository exists")


class SourceError(Exception):
    """A git source could not be resolved or exported.

    ``detail``: for the user — what went wrong and what to do; never a credential's value.
    ``code``: the kind of failure (``invalid``, ``unreachable``, ``credential_required``,
    ``credential_refused``, ``ref_not_found``, ``ambiguous_ref``, ``commit_not_found``,
    ``not_a_commit``, ``subdirectory_not_found``, ``too_large``, ``unsafe_path``,
    ``unsafe_symlink``, ``write_failed``, ``git_failed``).
    ``permanent``: retrying the same call will fail the same way.
    """

    def __init__(self, detail: str, *, code: str, permanent: bool = True) -> None:
        super().__init__(detail)
        self.detail = detail
        self.code = code
        self.permanent = permanent


def resolve(url: str, ref: str, credentials: Credentials | None = None) -> str:
    """The commit ``ref`` names in the repository at ``url`` now (one ``git ls-remote``).

    ``ref``: a branch or tag name, a full ref (``refs/heads/main``, ``refs/pull/7/head``),
    ``HEAD``, or a full 40-hex commit sha. An annotated tag is peeled to its commit. A name that
    is both a branch and a tag on different commits is refused (``ambiguous_ref``). A sha is
    returned as given (lower case) once the repository has answered: whether the server has it
    is known only by fetching it, and ``export`` says so clearly if it does not.
    """
    check_url(url, with_credentials=credentials is not None)
    ref = check_ref(ref)
    try:
        refs = cli.ls_remote(url, credentials)
    except cli.GitError as exc:
        raise _failure(exc, url, credentials) from None
    if _SHA.fullmatch(ref):
        return ref.lower()
    return _pick(refs, ref, url)


def export(
    url: str,
    commit: str,
    dest: Path,
    *,
    subdirectory: str = "",
    credentials: Credentials | None = None,
    max_bytes: int,
) -> None:
    """Write the tree of ``commit`` (only ``subdirectory`` of it, as the root, when given) into
    the empty directory ``dest`` as plain files: no ``.git``, no hooks, no submodules.

    Fetches that one commit (shallow) into a temporary repository, removed whatever happens.
    Refused before anything is written: a sub-directory that is not in the commit, files
    adding up to more than ``max_bytes``, a path or symlink leading outside the tree. If
    writing fails midway, ``dest`` is emptied again.
    """
    check_url(url, with_credentials=credentials is not None)
    commit = _check_commit(commit)
    sub = check_subdirectory(subdirectory)
    _check_max_bytes(max_bytes)
    dest = _check_dest(dest)
    where = f"{sub!r} of commit {commit}" if sub else f"commit {commit}"
    with tempfile.TemporaryDirectory(prefix="graphene-gitsource-") as tmp:
        repo = Path(tmp) / "repo.git"
        _git(["init", "--quiet", "--bare", str(repo)])
        try:
            cli.run(
                ["fetch", "--quiet", "--no-tags", "--no-auto-maintenance", "--depth=1", url, commit],
                cwd=repo,
                url=url,
                credentials=credentials,
                timeout=cli.NETWORK_TIMEOUT,
            )
        except cli.GitError as exc:
            raise _failure(exc, url, credentials, commit=commit) from None
        kind = _git(["cat-file", "-t", commit], cwd=repo).stdout.strip()
        if kind != "commit":
            raise SourceError(
                f"{commit} in {url} is a {kind}, not a commit: give a commit sha (resolve() peels tags to theirs)",
                code="not_a_commit",
            )
        if sub:
            _check_is_directory(repo, commit, sub, url)
        entries = _list_tree(repo, f"{commit}:{sub}" if sub else commit, where)
        files = [e for e in entries if e.mode in _REGULAR]
        links = {e.path: e for e in entries if e.mode == _SYMLINK}
        total = sum(e.size for e in files) + sum(e.size for e in links.values())
        if total > max_bytes:
            raise SourceError(
                f"the tree of {where} is {_bytes(total)} in {len(files) + len(links)} files, more than the "
                f"limit of {_bytes(max_bytes)}; nothing was written. Export a smaller sub-directory, or "
                "remove large files from the repository.",
                code="too_large",
            )
        targets = dict(zip(links, _read_blobs(repo, [e.sha for e in links.values()]), strict=True))
        link_targets = {path: target.decode(errors="surrogateescape") for path, target in targets.items()}
        for path in sorted(link_targets):
            if _escapes(path, link_targets):
                raise SourceError(
                    f"the symlink {path!r} in {where} points to {link_targets[path]!r}, outside the exported "
                    "tree; nothing was written. Make the link relative and inside the tree, or export a "
                    "directory that contains what it points to.",
                    code="unsafe_symlink",
                )
        try:
            _write(repo, dest, files, link_targets)
        except BaseException:
            _empty(dest)
            raise


def token_credentials(password: str) -> Credentials:
    """The credentials of a token or password for an http(s) repository (a source's credential:
    a secret's value), sent with the username ``x-access-token``, which GitHub expects with a
    token and GitLab and Gitea accept. A ``SourceError`` (``invalid``, never naming the value)
    if git cannot send it (empty, or more than one line)."""
    try:
        return Credentials(username=cli.DEFAULT_USERNAME, password=password.strip("\n"))
    except ValueError as exc:
        raise SourceError(f"the credential cannot be used as a git password: {exc}", code="invalid") from None


# -- validation ------------------------------------------------------------------------------


def _invalid(detail: str) -> SourceError:
    return SourceError(detail, code="invalid")


def _has_control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def check_url(url: str, *, with_credentials: bool = False) -> None:
    """A ``SourceError`` (``invalid``) unless ``url`` is a repository URL git may be given:
    a known scheme, a host (or a path for ``file://``), no user:password in it, and, when a
    credential goes with it, http(s)."""
    if not isinstance(url, str) or not url.strip():
        raise _invalid("the repository URL is empty: give an http(s)://, git://, ssh:// or file:// URL")
    if _has_control(url) or any(c.isspace() for c in url):
        raise _invalid("the repository URL contains whitespace or control characters")
    if cli.url_has_credentials(url):
        # Not echoed: it holds a secret.
        raise _invalid(
            "the repository URL carries credentials (user:password@); remove them from the URL "
            "and give the source a credential instead"
        )
    if "://" not in url:
        raise _invalid(
            f"{url!r} is not a URL with a scheme ({', '.join(SCHEMES)}); an address such as "
            "git@host:org/app.git is written ssh://git@host/org/app.git"
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise _invalid(f"{url!r} is not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise _invalid(f"{url!r}: the scheme {parts.scheme!r} is not one of {', '.join(SCHEMES)}")
    if scheme == "file" and not parts.path:
        raise _invalid(f"{url!r} names no path")
    if scheme != "file" and not parts.hostname:
        raise _invalid(f"{url!r} names no host")
    if with_credentials and scheme not in ("http", "https"):
        raise _invalid(
            f"a credential is a token or password for an http(s) repository; {scheme}:// URLs take none "
            "(ssh uses the worker's own ssh configuration)"
        )


def check_ref(ref: str) -> str:
    """``ref`` if it can name a ref or a commit (not empty, no blanks, no leading '-'); else a
    ``SourceError`` (``invalid``). Whether the repository has it is for ``resolve`` to say."""
    if not isinstance(ref, str) or not ref:
        raise _invalid("the ref is empty: give a branch, a tag or a full commit sha")
    if _has_control(ref) or any(c.isspace() for c in ref):
        raise _invalid(f"the ref {ref!r} contains whitespace or control characters")
    if ref.startswith("-"):
        raise _invalid(f"the ref {ref!r} starts with '-'")
    return ref


def _check_commit(commit: str) -> str:
    if not isinstance(commit, str) or not _SHA.fullmatch(commit):
        raise _invalid(
            f"{commit!r} is not a commit sha: give the full 40 hexadecimal characters (resolve() returns one)"
        )
    return commit.lower()


def check_subdirectory(subdirectory: str) -> str:
    """``subdirectory`` normalized (``./a//b/`` → ``a/b``; ``""`` or ``.`` → the root)."""
    if not isinstance(subdirectory, str):
        raise _invalid("the sub-directory must be a string")
    if _has_control(subdirectory):
        raise _invalid(f"the sub-directory {subdirectory!r} contains control characters")
    if subdirectory.startswith("/"):
        raise _invalid(f"the sub-directory {subdirectory!r} is absolute: give a path relative to the repository's root")
    parts = [p for p in subdirectory.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _invalid(f"the sub-directory {subdirectory!r} contains '..': give a path inside the repository")
    if any(p.lower() == ".git" for p in parts):
        raise _invalid(f"the sub-directory {subdirectory!r} names .git, which is not part of a tree")
    return "/".join(parts)


def _check_max_bytes(max_bytes: int) -> None:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise _invalid(f"max_bytes must be a positive number of bytes, not {max_bytes!r}")


def _check_dest(dest: Path) -> Path:
    dest = Path(dest)
    if not dest.is_dir():
        raise _invalid(f"{dest} is not a directory: export writes into an existing empty directory")
    with os.scandir(dest) as found:
        if next(found, None) is not None:
            raise _invalid(f"{dest} is not empty: export writes into an empty directory")
    return dest


# -- resolving -------------------------------------------------------------------------------


def _pick(refs: dict[str, str], ref: str, url: str) -> str:
    """The commit ``ref`` names among ``refs`` (``ls-remote``'s), by git's own rules for a short
    name (``x``, ``refs/x``, ``refs/tags/x``, ``refs/heads/x``), annotated tags peeled."""
    names = (
        [ref]
        if ref == "HEAD" or ref.startswith("refs/")
        else [ref, f"refs/{ref}", f"refs/tags/{ref}", f"refs/heads/{ref}"]
    )
    found = {name: refs.get(f"{name}^{{}}", refs[name]) for name in names if name in refs and not name.endswith("^{}")}
    if len(set(found.values())) > 1:
        choices = ", ".join(f"{name} ({sha[:12]})" for name, sha in found.items())
        raise SourceError(
            f"the ref {ref!r} of {url} is ambiguous: {choices}. Give the full name of the one you mean.",
            code="ambiguous_ref",
        )
    if found:
        return next(iter(found.values()))
    raise SourceError(f"the ref {ref!r} was not found in {url}. {_known_refs(refs, ref)}", code="ref_not_found")


def _known_refs(refs: dict[str, str], ref: str) -> str:
    branches = sorted(n.removeprefix("refs/heads/") for n in refs if n.startswith("refs/heads/"))
    tags = sorted(n.removeprefix("refs/tags/") for n in refs if n.startswith("refs/tags/") and not n.endswith("^{}"))
    if not branches and not tags:
        said = "The repository has no branches or tags (is it empty?)."
    else:
        said = " ".join(
            f"{title}: {_some(names)}." for title, names in (("Branches", branches), ("Tags", tags)) if names
        )
    if _ABBREVIATED_SHA.fullmatch(ref):
        said += " An abbreviated commit sha cannot be looked up on a server: give all 40 characters."
    else:
        said += " Give one of these, or a full 40-character commit sha."
    return said


def _some(names: list[str]) -> str:
    shown = ", ".join(names[:_REFS_SHOWN])
    return shown if len(names) <= _REFS_SHOWN else f"{shown} and {len(names) - _REFS_SHOWN} more"


def _git_said(exc: cli.GitError) -> str:
    """The cause in git's message: its first lines, without the advice git adds after it."""
    _prefix, sep, said = str(exc).partition("): ")  # "git fetch failed (exit 128): <git's output>"
    lines = []
    for line in (said if sep else str(exc)).splitlines():
        line = line.strip().removeprefix("fatal: ").removeprefix("error: ").strip()
        if line and not line.lower().startswith(_NOISE):
            lines.append(line)
    return " / ".join(lines[:3])[:400] or str(exc)[:400]


def _failure(exc: cli.GitError, url: str, credentials: Credentials | None, *, commit: str | None = None) -> SourceError:
    """The ``SourceError`` for a git command against ``url`` that failed (its message redacted)."""
    said = _git_said(exc)
    lowered = str(exc).lower()
    if "permission denied (publickey" in lowered:
        return SourceError(
            f"the ssh server of {url} refused the worker's ssh key (git said: {said}). ssh URLs use the "
            "worker's own ssh configuration: give its key read access, or use an https URL with a credential.",
            code="credential_refused",
        )
    if "host key verification failed" in lowered:
        return SourceError(
            f"the ssh host key of {url} is not known to the worker: add it to the worker's known_hosts.",
            code="unreachable",
        )
    if any(marker in lowered for marker in _NO_CREDENTIAL + _REFUSED):
        if credentials is None:
            return SourceError(
                f"{url} asks for a credential and none was given: give the source a credential "
                "(a token or password that may read the repository).",
                code="credential_required",
            )
        return SourceError(
            f"the server refused the credential given for user {credentials.username!r} at {url}: check that "
            "the token or password is valid, not expired, and may read the repository.",
            code="credential_refused",
        )
    if commit is not None and "unadvertised object" in lowered:
        return SourceError(
            f"the server of {url} does not allow fetching a commit by its sha ({commit}): export needs a server "
            "that does (git protocol v2, or uploadpack.allowReachableSHA1InWant).",
            code="commit_not_found",
        )
    if commit is not None and any(marker in lowered for marker in _NO_COMMIT):
        return SourceError(
            f"commit {commit} was not found in {url}: it may never have been pushed there, or no branch or tag "
            "reaches it any more. Resolve the ref again to get a commit the repository has.",
            code="commit_not_found",
        )
    if any(marker in lowered for marker in _NO_REPOSITORY) or _NO_REPOSITORY_HTTP.search(lowered):
        return SourceError(
            f"there is no git repository at {url} ({said}): check the URL's path, and that the server "
            "serves that repository.",
            code="unreachable",
        )
    if any(marker in lowered for marker in _NO_CONNECTION):
        return SourceError(
            f"the repository {url} cannot be reached: {said}. Check the URL's host and port, and that the "
            "server is up.",
            code="unreachable",
            permanent=exc.permanent,
        )
    return SourceError(f"git failed on {url}: {said}", code="git_failed", permanent=exc.permanent)


# -- exporting -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    mode: str
    sha: str
    size: int  # 0 for a submodule (git prints "-")
    path: str  # relative to the exported root


def _git(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """A local git command on our own temporary repository; a failure is ours, not the user's."""
    try:
        return cli.run(args, cwd=cwd)
    except cli.GitError as exc:
        raise SourceError(f"git failed while exporting: {_git_said(exc)}", code="git_failed", permanent=False) from None


def _check_is_directory(repo: Path, commit: str, sub: str, url: str) -> None:
    """``sub`` is a directory of ``commit``'s tree: else a ``SourceError`` naming both.

    Its parent's entries are read (``ls-tree <commit>:<parent>``, a literal path, no pathspec
    magic), so a file or a submodule at that path is told apart from nothing at all.
    """
    parent, _, name = sub.rpartition("/")
    listed = cli.run(["ls-tree", "-z", f"{commit}:{parent}"], cwd=repo, check=False)
    kind = None
    if listed.returncode == 0:
        for record in listed.stdout.split("\0"):
            meta, _, path = record.partition("\t")
            if path == name:
                kind = meta.split()[1]
    if kind == "tree":
        return
    what = {"blob": "is a file, not a directory", "commit": "is a submodule, which export does not fetch"}
    raise SourceError(
        f"the sub-directory {sub!r} {what.get(kind or '', 'does not exist')} in commit {commit} of {url}. "
        "Check the source's sub-directory (a path from the repository's root) and its ref.",
        code="subdirectory_not_found",
    )


def _list_tree(repo: Path, treeish: str, where: str) -> list[_Entry]:
    """Every entry under ``treeish`` (recursively, with sizes), each path checked to stay inside."""
    listed = _git(["ls-tree", "-r", "-l", "-z", treeish], cwd=repo)
    entries = []
    for record in listed.stdout.split("\0"):
        if not record:
            continue
        meta, _, path = record.partition("\t")
        mode, _kind, sha, size = meta.split()
        parts = path.split("/")
        if any(p in ("", ".", "..") or p.lower() == ".git" for p in parts):
            raise SourceError(
                f"the tree of {where} holds the path {path!r}, which git itself refuses to check out; "
                "nothing was written",
                code="unsafe_path",
            )
        entries.append(_Entry(mode=mode, sha=sha, size=0 if size == "-" else int(size), path=path))
    return entries


def _read_blobs(repo: Path, shas: list[str]) -> list[bytes]:
    """The contents of blobs ``shas``, in order, from one ``git cat-file --batch``.

    ``cli.run`` speaks text and takes no input; this needs bytes both ways, so it builds its
    process from ``cli``'s argv and environment (local: no URL, no credential).
    """
    if not shas:
        return []
    env = cli.environment()
    env["GIT_CEILING_DIRECTORIES"] = str(repo.resolve().parent)
    try:
        done = subprocess.run(
            cli.command(["cat-file", "--batch"], repo),
            input="".join(f"{sha}\n" for sha in shas).encode(),
            env=env,
            capture_output=True,
            timeout=cli.LOCAL_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SourceError(
            f"git cat-file timed out after {cli.LOCAL_TIMEOUT:g}s", code="git_failed", permanent=False
        ) from None
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip()[-400:]
        raise SourceError(f"git cat-file failed while exporting: {message}", code="git_failed", permanent=False)
    out = memoryview(done.stdout)
    blobs = []
    at = 0
    for sha in shas:
        end = done.stdout.index(b"\n", at)
        header = bytes(out[at:end]).decode(errors="replace").split()
        if len(header) != 3 or header[1] != "blob":
            raise SourceError(
                f"object {sha} of the fetched tree is missing or not a file ({' '.join(header)})", code="git_failed"
            )
        size = int(header[2])
        blobs.append(bytes(out[end + 1 : end + 1 + size]))
        at = end + 1 + size + 1  # the contents are followed by a newline
    return blobs


def _batches(files: list[_Entry]) -> Iterable[list[_Entry]]:
    """``files`` in consecutive groups of at most ``_BATCH_BYTES`` (a bigger file alone)."""
    batch: list[_Entry] = []
    size = 0
    for entry in files:
        if batch and size + entry.size > _BATCH_BYTES:
            yield batch
            batch, size = [], 0
        batch.append(entry)
        size += entry.size
    if batch:
        yield batch


def _escapes(link: str, targets: dict[str, str]) -> bool:
    """Whether following the symlink ``link`` leads outside the exported tree, following the
    tree's other symlinks on the way as the kernel would (``a -> ..`` then ``b -> a/..``
    escapes, though ``a/..`` alone would not)."""
    stack = link.split("/")[:-1]  # the directory the link is in
    pending = targets[link].split("/")
    if targets[link].startswith("/"):
        return True
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                return True
            stack.pop()
            continue
        stack.append(part)
        target = targets.get("/".join(stack))
        if target is not None:
            hops += 1
            if hops > _SYMLINK_HOPS:
                return False  # a loop: it resolves to nothing, inside or out
            if target.startswith("/"):
                return True
            stack.pop()
            pending = target.split("/") + pending
    return False


def _write(repo: Path, dest: Path, files: list[_Entry], links: dict[str, str]) -> None:
    """Files first, then symlinks: no file is ever written through a link of the tree's.

    A file is created exclusively (``O_EXCL | O_NOFOLLOW``), so nothing is overwritten or
    written through a link, even in a malformed tree that names a path twice.
    """
    try:
        for path in sorted({str(Path(p).parent) for p in [*(e.path for e in files), *links]} - {"."}):
            (dest / path).mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for batch in _batches(files):
            for entry, content in zip(batch, _read_blobs(repo, [e.sha for e in batch]), strict=True):
                fd = os.open(dest / entry.path, flags, _REGULAR[entry.mode])
                with os.fdopen(fd, "wb") as handle:
                    handle.write(content)
        for path, target in links.items():
            os.symlink(target, dest / path)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in a link's target
        raise SourceError(
            f"writing the exported tree into {dest} failed: {exc}", code="write_failed", permanent=False
        ) from None


def _empty(dest: Path) -> None:
    """Remove everything in ``dest`` (which export found empty): no half-written tree is left."""
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _bytes(n: int) -> str:
    """``1536 bytes (1.5 KiB)``: exact, and readable."""
    size, unit = float(n), ""
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{n} bytes ({size:.1f} {unit})" if unit else f"{n} bytes"
