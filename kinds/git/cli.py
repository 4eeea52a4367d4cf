"""Running the ``git`` command line: credentials through the environment, errors classified.

Stdlib only (no Django): the checkout kind and the SDK's git actions both run git through
``run``. Credentials never touch the disk or a command line:

* the token or password is put in the child's environment (``GRAPHENE_GIT_PASSWORD``), which
  only the same user (and root) can read in ``/proc/<pid>/environ`` — unlike argv, which
  ``ps`` shows to everyone;
* git learns how to read it from configuration that is itself passed in the environment
  (``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_n``/``GIT_CONFIG_VALUE_n``, git >= 2.31): the
  credential helper list is reset (so a ``store`` helper of the machine's config never writes
  our token to a file) and one helper, a shell function that prints the two variables, is
  installed for the repository's scheme and host only (a submodule on another host never
  receives it);
* what git prints is redacted before it reaches an exception (and so the record's events).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

# Network operations (clone, fetch, push) may be slow; local ones are not.
NETWORK_TIMEOUT = 900.0
LOCAL_TIMEOUT = 120.0
DEFAULT_USERNAME = "x-access-token"  # what GitHub expects with a token; GitLab accepts any name

PASSWORD_ENV = "GRAPHENE_GIT_PASSWORD"  # noqa: S105 - the name of a variable, not a password
USERNAME_ENV = "GRAPHENE_GIT_USERNAME"
# The helper is code, not data: it reads the two variables when git asks ("get") and ignores
# "store" and "erase". It contains no secret, so it may sit in the environment of every child.
CREDENTIAL_HELPER = (
    '!f() { test "$1" = get || return 0; '
    f'printf "username=%s\\npassword=%s\\n" "${USERNAME_ENV}" "${PASSWORD_ENV}"; }}; f'
)

# git's messages for failures that retrying cannot fix (lower case, as git prints them).
_PERMANENT = (
    "couldn't find remote ref",
    "not our ref",
    "authentication failed",
    "terminal prompts disabled",  # the server wants credentials and none were given
    "invalid username or password",
    "does not appear to be a git repository",
    "repository not found",
    "not found: did you run git update-server-info",
    "unable to find remote helper",
    "transport '",  # "transport 'ext' not allowed"
    "is not a commit",
    "not a valid object name",
)


class GitError(Exception):
    """A git command failed. ``permanent``: retrying the same command will fail the same way."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class Credentials:
    """A username and a token or password for an http(s) repository. ``repr`` hides the password."""

    username: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.username or any(c in self.username for c in "\n\r\0"):
            raise ValueError("the git username must be a non-empty single line")
        if not self.password or any(c in self.password for c in "\n\r\0"):
            raise ValueError("the git password must be a non-empty single line")


def git_binary() -> str:
    found = shutil.which("git")
    if found is None:
        raise GitError("git is not installed on this server (apt-get install git)", permanent=True)
    return found


def url_has_credentials(url: str) -> bool:
    """Whether a repository URL carries a password, or any user part for http(s)."""
    if "://" not in url:
        return False
    parts = urlsplit(url)
    if parts.password is not None:
        return True
    return parts.scheme in ("http", "https") and parts.username is not None


def credential_scope(url: str) -> str:
    """``scheme://host[:port]``: where a credential may be sent; refuses non-http(s) URLs."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise GitError(
            "auth is a token or password for an http(s) repository; "
            f"{parts.scheme or 'this'} URLs take none (ssh keys are not supported yet)",
            permanent=True,
        )
    return f"{parts.scheme}://{parts.netloc}"


def environment(
    url: str | None = None, credentials: Credentials | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment for a git child process; with ``credentials``, scoped to ``url``'s host."""
    env = dict(os.environ if base is None else base)
    # Never prompt (a prompt would hang a worker) and never read credentials from a terminal.
    env["GIT_TERMINAL_PROMPT"] = "0"
    env.pop("GIT_ASKPASS", None)
    env.pop("SSH_ASKPASS", None)
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    # Abort transfers that stall (below 1 KB/s for a minute) instead of waiting forever.
    env.setdefault("GIT_HTTP_LOW_SPEED_LIMIT", "1000")
    env.setdefault("GIT_HTTP_LOW_SPEED_TIME", "60")
    # Inherited repository pointers would aim every command at another repository.
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_CEILING_DIRECTORIES"):
        env.pop(name, None)
    env.pop(PASSWORD_ENV, None)
    env.pop(USERNAME_ENV, None)
    # Configuration from the environment, appended to any the caller's environment already had.
    # No hooks: a checkout or a commit made by Graphene runs no code from a hooks directory
    # (the machine's ``core.hooksPath`` included), with a credential in its environment.
    config: list[tuple[str, str]] = [("core.hooksPath", os.devnull)]
    if credentials is not None:
        if url is None:
            raise ValueError("credentials need the repository URL they are for")
        scope = credential_scope(url)
        config += [
            ("credential.helper", ""),  # an empty value resets the list: no machine-wide helper
            (f"credential.{scope}.helper", CREDENTIAL_HELPER),
        ]
        env[USERNAME_ENV] = credentials.username
        env[PASSWORD_ENV] = credentials.password
    start = int(env.get("GIT_CONFIG_COUNT", "0") or 0)
    for i, (key, value) in enumerate(config, start):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    env["GIT_CONFIG_COUNT"] = str(start + len(config))
    return env


def redact(text: str, credentials: Credentials | None) -> str:
    if credentials is not None:
        text = text.replace(credentials.password, "***")
    return text


def command(args: Sequence[str], cwd: Path | None = None) -> list[str]:
    """The argv for ``git args`` (in ``cwd``, never a parent repository: see ``run``)."""
    argv = [git_binary()]
    if cwd is not None:
        argv += ["-C", str(cwd)]
    return [*argv, *args]


def run(
    args: Sequence[str],
    *,
    cwd: Path | None = None,
    url: str | None = None,
    credentials: Credentials | None = None,
    timeout: float = LOCAL_TIMEOUT,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``git args``; raise ``GitError`` (redacted, classified) if it fails and ``check``.

    With ``cwd``, git is kept from discovering a repository above it (a stranger's directory
    under a parent repository must not be mistaken for a repository of ours).
    """
    env = environment(url, credentials)
    if cwd is not None:
        env["GIT_CEILING_DIRECTORIES"] = str(Path(cwd).resolve().parent)
    argv = command(args, cwd)
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
        )
    except subprocess.TimeoutExpired:
        raise GitError(f"git {args[0]} timed out after {timeout:g}s") from None
    if check and done.returncode != 0:
        detail = redact((done.stderr or done.stdout).strip(), credentials)
        lowered = detail.lower()
        raise GitError(
            f"git {args[0]} failed (exit {done.returncode}): {detail[-2000:]}",
            permanent=any(marker in lowered for marker in _PERMANENT),
        )
    if credentials is not None:
        done.stdout = redact(done.stdout, credentials)
        done.stderr = redact(done.stderr, credentials)
    return done


def rev_parse(cwd: Path, rev: str) -> str | None:
    done = run(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=cwd, check=False)
    sha = done.stdout.strip()
    return sha if done.returncode == 0 and sha else None


def ls_remote(url: str, credentials: Credentials | None = None) -> dict[str, str]:
    """Every ref of a remote repository and the object it names (``refs/tags/x^{}``: peeled)."""
    done = run(["ls-remote", "--", url], url=url, credentials=credentials, timeout=NETWORK_TIMEOUT)
    refs: dict[str, str] = {}
    for line in done.stdout.splitlines():
        sha, _, ref = line.partition("\t")
        if ref:
            refs[ref] = sha
    return refs
