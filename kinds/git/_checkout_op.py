"""What the ``git.checkout`` kind does to a directory, as one self-contained function.

``checkout_op`` uses only the standard library and the ``git`` command line of the machine it
runs on, and imports inside its body: the same code runs in the server's process (checkouts
under ``GRAPHENE_DATA_DIR/checkouts``) and, sent as an agent's ``call`` command
(``kinds.machine``), on an agent's machine. It is the one place that knows the marker, the
aside directory, how a ref is fetched and resolved, and how a checkout is removed.

Errors say whether retrying can help by their type (the agent reports the type by name and
``kinds.machine.PERMANENT_ERROR_TYPES`` says which): ``ValueError`` is permanent (a bad ref, refused
credentials, an ``expected_commit`` mismatch), ``FileExistsError`` is a stranger's directory
(permanent too), ``RuntimeError`` is worth retrying (a network failure, a timeout). Any
other exception (an ``OSError``) is retried as well.

Credentials: the password arrives as an argument (on an agent, in a *sealed* command) and
reaches git only through the environment of the git processes that talk to the remote
(``GRAPHENE_GIT_PASSWORD``, read by a credential helper configured through
``GIT_CONFIG_COUNT``, scoped to the repository's origin), never argv or a file; what git
prints is redacted before it reaches an exception. This mirrors ``kinds.git.cli.environment``
(which the server's git actions use): a self-contained function cannot import it, so the
two must be kept in step.
"""

from __future__ import annotations

from typing import Any


def checkout_op(
    op: str, path: str, record_id: str, options: dict[str, Any] | None = None, password: str = ""
) -> dict[str, Any] | None:
    """``create`` (adopt-or-create, fetch, check out; returns ``path``, ``commit``, ``ref``,
    ``branch``, ``adopted``), ``observe`` (``None`` unless ours; ``path``, ``commit``,
    ``dirty``), ``remove`` (only if ours; absent is success), ``marker`` (the owner's id).

    ``options``: ``repository``, ``ref``, ``depth``, ``expected_commit``, ``submodules``,
    ``username``, ``converged`` (``[commit, branch]`` for a heal), ``previous`` (the directory
    of an earlier generation, removed once the new one is in place).
    """
    import os
    import shutil
    import subprocess
    from urllib.parse import urlsplit

    opts = dict(options or {})
    url = str(opts.get("repository") or "")
    username = str(opts.get("username") or "x-access-token")
    marker_name = "graphene-record"  # in the .git directory
    infix = ".graphene-"
    network_timeout = 900.0
    local_timeout = 120.0
    password_env = "GRAPHENE_GIT_PASSWORD"  # noqa: S105 - the name of a variable
    username_env = "GRAPHENE_GIT_USERNAME"
    helper = (
        '!f() { test "$1" = get || return 0; '
        f'printf "username=%s\\npassword=%s\\n" "${username_env}" "${password_env}"; }}; f'
    )
    permanent_markers = (  # git's messages for failures that retrying cannot fix
        "couldn't find remote ref",
        "not our ref",
        "authentication failed",
        "terminal prompts disabled",
        "invalid username or password",
        "does not appear to be a git repository",
        "repository not found",
        "not found: did you run git update-server-info",
        "unable to find remote helper",
        "transport '",
        "is not a commit",
        "not a valid object name",
    )

    def redact(text: str) -> str:
        return text.replace(password, "***") if password else text

    def scope() -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "auth is a token or password for an http(s) repository; "
                f"{parts.scheme or 'this'} URLs take none (ssh keys are not supported yet)"
            )
        return f"{parts.scheme}://{parts.netloc}"

    def environment(remote: bool, cwd: str | None) -> dict[str, str]:
        env = dict(os.environ)
        env["GIT_TERMINAL_PROMPT"] = "0"  # never prompt: a prompt would hang
        env.pop("GIT_ASKPASS", None)
        env.pop("SSH_ASKPASS", None)
        env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
        env.setdefault("GIT_HTTP_LOW_SPEED_LIMIT", "1000")
        env.setdefault("GIT_HTTP_LOW_SPEED_TIME", "60")
        for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_CEILING_DIRECTORIES"):
            env.pop(name, None)
        env.pop(password_env, None)
        env.pop(username_env, None)
        config = [("core.hooksPath", os.devnull)]  # no hooks run, with a credential around
        if remote and password:
            config += [("credential.helper", ""), (f"credential.{scope()}.helper", helper)]
            env[username_env] = username
            env[password_env] = password
        start = int(env.get("GIT_CONFIG_COUNT", "0") or 0)
        for i, (key, value) in enumerate(config, start):
            env[f"GIT_CONFIG_KEY_{i}"] = key
            env[f"GIT_CONFIG_VALUE_{i}"] = value
        env["GIT_CONFIG_COUNT"] = str(start + len(config))
        if cwd is not None:  # never a repository above it (a stranger's directory in a repository)
            env["GIT_CEILING_DIRECTORIES"] = os.path.dirname(os.path.realpath(cwd))
        return env

    def git(args: list[str], cwd: str | None = None, *, remote: bool = False, check: bool = True) -> Any:
        binary = shutil.which("git")
        if binary is None:
            raise ValueError("git is not installed on this machine (git >= 2.31 is needed)")
        argv = [binary, *(["-C", cwd] if cwd is not None else []), *args]
        timeout = network_timeout if remote else local_timeout
        try:
            done = subprocess.run(
                argv,
                env=environment(remote, cwd),
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"git {args[0]} timed out after {timeout:g}s") from None
        if check and done.returncode != 0:
            detail = redact((done.stderr or done.stdout).strip())
            message = f"git {args[0]} failed (exit {done.returncode}): {detail[-2000:]}"
            if any(marker in detail.lower() for marker in permanent_markers):
                raise ValueError(message)
            raise RuntimeError(message)
        return done

    def rev_parse(cwd: str, rev: str) -> str | None:
        done = git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd, check=False)
        sha = str(done.stdout).strip()
        return sha if done.returncode == 0 and sha else None

    def read_marker(target: str) -> str | None:
        try:
            with open(os.path.join(target, ".git", marker_name)) as handle:
                return handle.read().strip() or None
        except (FileNotFoundError, NotADirectoryError):
            return None

    def is_ours(target: str) -> bool:
        return not os.path.islink(target) and os.path.isdir(target) and read_marker(target) == record_id

    def aside(target: str) -> str:
        head, name = os.path.split(target)
        return os.path.join(head, f".{name}{infix}{record_id}")

    def remove_tree(target: str) -> None:
        """A file or a directory tree (a symlink itself, never what it points to)."""
        if not os.path.lexists(target):
            return
        if os.path.islink(target) or not os.path.isdir(target):
            os.unlink(target)
            return
        shutil.rmtree(target)

    def remove(target: str) -> bool:
        # Renamed aside (ours by its name) first: a crash midway leaves no unmarked remains at
        # the path, and the retry (or the sweeper) finds the aside directory by its name.
        ours = is_ours(target)
        if ours:
            remove_tree(aside(target))
            os.rename(target, aside(target))
        remove_tree(aside(target))
        return ours

    def init(target: str) -> None:
        """An empty marked repository at ``target``, made aside and renamed into place."""
        tmp = aside(target)
        remove_tree(tmp)  # a crashed attempt of ours
        os.makedirs(os.path.dirname(target) or "/", exist_ok=True)
        git(["init", "--quiet", tmp])
        with open(os.path.join(tmp, ".git", marker_name), "w") as handle:
            handle.write(record_id + "\n")
        if os.path.lexists(target):  # appeared since we looked: a stranger's after all
            remove_tree(tmp)
            raise FileExistsError(f"{target} appeared while the checkout was being made; refusing to adopt it")
        os.rename(tmp, target)

    def fetched(target: str) -> tuple[str, str | None]:
        """What ``git fetch`` got for its one ref, and the branch name if it was a branch
        (``FETCH_HEAD``: ``<sha>\\t<flag>\\tbranch 'main' of <url>``)."""
        with open(os.path.join(target, ".git", "FETCH_HEAD")) as handle:
            lines = [line for line in handle.read().splitlines() if line.strip()]
        if not lines:
            raise RuntimeError("git fetch wrote no FETCH_HEAD")
        sha, _flag, description = [*lines[0].split("\t"), "", ""][:3]
        branch = None
        if description.startswith("branch '"):
            branch = description[len("branch '") :].rsplit("' of ", 1)[0]
        return sha, branch

    def converge(target: str) -> dict[str, Any]:
        ref = str(opts.get("ref") or "HEAD")
        depth = opts.get("depth")
        expected = opts.get("expected_commit")
        converged = opts.get("converged")
        git(["config", "remote.origin.url", url], target)
        fetch = ["fetch", "--quiet", "--no-tags"]  # the ref itself, resolved through FETCH_HEAD
        if depth:
            fetch.append(f"--depth={int(depth)}")
        if converged:
            # A heal: back to the commit this generation converged to, not to wherever the
            # ref points now; fetched only if it is not here (by sha, else through the ref).
            commit, branch = str(converged[0]), converged[1]
            if rev_parse(target, commit) is None:
                try:
                    git([*fetch, "origin", commit], target, remote=True)
                except (ValueError, RuntimeError):
                    git([*fetch, "origin", ref], target, remote=True)
            if rev_parse(target, commit) is None:
                raise ValueError(f"commit {commit} (the checkout's) can no longer be fetched from {url}")
        else:
            git([*fetch, "origin", ref], target, remote=True)
            sha, branch = fetched(target)
            resolved = rev_parse(target, sha)
            if resolved is None:
                raise ValueError(f"ref {ref!r} of {url} names {sha}, which is not a commit")
            commit = resolved
        if expected and commit != expected:
            raise ValueError(
                f"ref {ref!r} of {url} resolved to {commit}, not the expected commit {expected}; "
                "the working tree was left as it was"
            )
        if branch:
            # A local branch of the same name, tracking origin's: a commit can be pushed back.
            git(["checkout", "--quiet", "--force", "-B", branch, commit], target)
            git(["config", f"branch.{branch}.remote", "origin"], target)
            git(["config", f"branch.{branch}.merge", f"refs/heads/{branch}"], target)
            git(["update-ref", f"refs/remotes/origin/{branch}", commit], target)
        else:
            git(["checkout", "--quiet", "--force", "--detach", commit], target)
        if opts.get("submodules"):
            git(["submodule", "sync", "--quiet", "--recursive"], target)
            git(["submodule", "update", "--init", "--recursive", "--force", "--quiet"], target, remote=True)
        return {"path": target, "commit": rev_parse(target, "HEAD"), "ref": ref, "branch": branch}

    def create(target: str) -> dict[str, Any]:
        adopted = os.path.lexists(target)
        if adopted:
            owner = read_marker(target) if os.path.isdir(target) and not os.path.islink(target) else None
            if owner != record_id:
                whose = f"record {owner}" if owner else "no Graphene record"
                raise FileExistsError(f"{target} already exists and belongs to {whose}; refusing to adopt it")
        if password:
            scope()  # auth for a URL that cannot use it: fail before touching the disk
        if not adopted:
            init(target)
        outputs = converge(target)
        previous = str(opts.get("previous") or "")
        if previous and os.path.normpath(previous) != os.path.normpath(target):
            remove(previous)  # a new generation with another path: the previous directory goes
        return {**outputs, "adopted": adopted}

    def main() -> dict[str, Any] | None:
        if op == "marker":
            owner = read_marker(path)
            return {"record": owner} if owner else None
        if op == "observe":
            if not is_ours(path):
                return None
            status = git(["status", "--porcelain", "--untracked-files=no"], path)
            return {"path": path, "commit": rev_parse(path, "HEAD"), "dirty": bool(str(status.stdout).strip())}
        if op == "remove":
            previous = str(opts.get("previous") or "")
            targets = [p for p in (previous, path) if p]
            removed = [p for i, p in enumerate(targets) if p not in targets[:i] and remove(p)]
            return {"removed": removed}
        if op == "create":
            return create(path)
        raise ValueError(f"unknown checkout operation {op!r}")

    try:
        return main()
    except (ValueError, RuntimeError):
        raise  # messages made here: git's output in them is redacted already
    except Exception as exc:
        if password and password in str(exc):  # never carry the value out in a message
            raise RuntimeError(f"{type(exc).__name__}: {redact(str(exc))}") from None
        raise
