"""The remote half of ``ctx.agent_via_ssh``: runs on the target machine, never on the server.

``apps.agents.ssh_install`` sends this file's source over SSH as ``python3 - MODE ARGS`` (the
program on stdin) and reads the one JSON line it prints. Standard library only, and Python
3.9 syntax (the agent's minimum), because it runs on whatever the machine has. It never
imports Django and never sees a private key: only paths, the agent id and a manifest.

Everything lives in ``~/.graphene-agent/<agent id>/`` (mode 0700): ``agent.pyz``, ``agent.env``
(0600: it holds the bootstrap token until the agent exchanged it), ``install.json`` (what is
installed: agent id, server, zipapp SHA-256, labels), ``agent.pid``, ``agent.log`` and
``state/`` (the credential and the command journal).

Modes:

``check MANIFEST``
    Creates the directory, then reports whether the agent described by MANIFEST runs
    (``running`` and ``current``) and whether the zipapp there is the right one.
``start MANIFEST NONCE``
    Under an exclusive lock: if the agent runs and is current, does nothing (``changed:
    false``). Else stops an outdated agent, moves the files uploaded as ``.agent.*.NONCE.tmp``
    into place, and starts the agent detached — a systemd unit where one can be installed,
    else a new session with a pid file — so that it outlives the SSH session.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

BASE = os.path.join(os.path.expanduser("~"), ".graphene-agent")
STOP_SECONDS = 10.0
# An agent that cannot start at all (bad config, a Python too old) exits within this time.
EARLY_EXIT_SECONDS = 1.0
STALE_UPLOAD_SECONDS = 600


class Failure(Exception):
    pass


def _paths(agent_id: str) -> dict[str, str]:
    if not agent_id or "/" in agent_id or agent_id.startswith("."):
        raise Failure(f"bad agent id {agent_id!r}")
    directory = os.path.join(BASE, agent_id)
    return {
        "dir": directory,
        "pyz": os.path.join(directory, "agent.pyz"),
        "env": os.path.join(directory, "agent.env"),
        "manifest": os.path.join(directory, "install.json"),
        "pid": os.path.join(directory, "agent.pid"),
        "log": os.path.join(directory, "agent.log"),
        "state": os.path.join(directory, "state"),
        "lock": os.path.join(directory, ".install.lock"),
        "unit": f"graphene-agent-{agent_id}.service",
    }


def _private_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)


def _sha256(path: str) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def _read_json(path: str) -> dict[str, object] | None:
    try:
        with open(path) as handle:
            value = json.load(handle)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_atomic(path: str, data: str, mode: int) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


# --- processes ------------------------------------------------------------------------------


def _cmdline(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        pass
    try:  # no /proc (BSD, macOS)
        out = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True, text=True, check=False)
    except OSError:
        return None
    return out.stdout.strip() or None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (dead, not yet reaped) is not running
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _background_pid(paths: dict[str, str]) -> int | None:
    """The agent started with a pid file, if it still runs (the pid is checked against its command line)."""
    try:
        with open(paths["pid"]) as handle:
            pid = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    if pid <= 1 or not _alive(pid):
        return None
    command = _cmdline(pid) or ""
    return pid if paths["env"] in command else None  # else the pid was reused by another process


def _systemctl() -> list[str] | None:
    """How to talk to systemd here, or None: the system manager as root, else the user's manager."""
    if os.environ.get("GRAPHENE_AGENT_NO_SYSTEMD") or not os.path.isdir("/run/systemd/system"):
        return None
    if shutil.which("systemctl") is None:
        return None
    if os.geteuid() == 0:
        return ["systemctl"] if os.access("/etc/systemd/system", os.W_OK) else None
    probe = subprocess.run(
        ["systemctl", "--user", "show-environment"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return ["systemctl", "--user"] if probe.returncode == 0 else None


def _unit_path(systemctl: list[str], unit: str) -> str:
    if systemctl == ["systemctl"]:
        return os.path.join("/etc/systemd/system", unit)
    return os.path.join(os.path.expanduser("~"), ".config", "systemd", "user", unit)


def _unit_pid(systemctl: list[str] | None, paths: dict[str, str]) -> int | None:
    if systemctl is None or not os.path.exists(_unit_path(systemctl, paths["unit"])):
        return None
    active = subprocess.run([*systemctl, "is-active", "--quiet", paths["unit"]], check=False)
    if active.returncode != 0:
        return None
    shown = subprocess.run(
        [*systemctl, "show", "--property", "MainPID", "--value", paths["unit"]],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        pid = int(shown.stdout.strip() or "0")
    except ValueError:
        pid = 0
    return pid or None


def _status(paths: dict[str, str], manifest: dict[str, object]) -> dict[str, object]:
    systemctl = _systemctl()
    unit_pid = _unit_pid(systemctl, paths)
    background = _background_pid(paths)
    pid = unit_pid or background
    # How it runs, or would be started: systemd wherever a unit can be installed.
    method = "systemd" if unit_pid or (systemctl is not None and background is None) else "background"
    pyz_current = _sha256(paths["pyz"]) == manifest.get("pyz_sha256")
    return {
        "ok": True,
        "dir": paths["dir"],
        "running": pid is not None,
        "pid": pid,
        "method": method,
        "current": pyz_current and _read_json(paths["manifest"]) == manifest,
        "pyz_current": pyz_current,
        "python": ".".join(str(part) for part in sys.version_info[:3]),
    }


def _stop(paths: dict[str, str]) -> int | None:
    """Stop whatever runs this agent (unit and/or background process); returns the pid stopped."""
    stopped = None
    systemctl = _systemctl()
    if systemctl is not None and os.path.exists(_unit_path(systemctl, paths["unit"])):
        stopped = _unit_pid(systemctl, paths)
        subprocess.run([*systemctl, "stop", paths["unit"]], check=False)
    pid = _background_pid(paths)
    if pid is not None:
        stopped = pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(paths["pid"])
    return stopped


def _log_tail(paths: dict[str, str], size: int = 2000) -> str:
    try:
        with open(paths["log"], "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - size))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _start_systemd(systemctl: list[str], paths: dict[str, str]) -> int | None:
    unit_path = _unit_path(systemctl, paths["unit"])
    os.makedirs(os.path.dirname(unit_path), exist_ok=True)
    target = "multi-user.target" if systemctl == ["systemctl"] else "default.target"
    unit = (
        "[Unit]\n"
        "Description=Graphene agent {id} (outbound-only; listens on no port)\n"
        "Wants=network-online.target\n"
        "After=network-online.target\n\n"
        "[Service]\n"
        'ExecStart="{python}" "{pyz}" --config "{env}"\n'
        # Verbatim, unquoted: systemd unquotes ExecStart= but not WorkingDirectory=, where quotes
        # make the path relative, a fatal "bad unit file setting".
        "WorkingDirectory={dir}\n"
        # The system manager gives a unit without User= no $HOME: the agent (and every command it
        # runs) gets the one the install ran with, as the background process and a user unit do.
        'Environment="HOME={home}"\n'
        "Restart=always\n"
        "RestartSec=5\n"
        "# 78: refused for good (revoked, foreign or used credential, deleted record); 2: bad config.\n"
        "RestartPreventExitStatus=78 2\n\n"
        "[Install]\n"
        "WantedBy={target}\n"
    ).format(
        id=os.path.basename(paths["dir"]),
        python=sys.executable,
        pyz=paths["pyz"],
        env=paths["env"],
        dir=paths["dir"],
        home=os.path.expanduser("~"),
        target=target,
    )
    _write_atomic(unit_path, unit, 0o644)
    for action in (["daemon-reload"], ["enable", paths["unit"]], ["restart", paths["unit"]]):
        done = subprocess.run([*systemctl, *action], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise Failure(f"{' '.join([*systemctl, *action])} failed: {done.stderr.strip()[-500:]}")
    return _unit_pid(systemctl, paths)


def _start_background(paths: dict[str, str]) -> int:
    with open(paths["log"], "ab") as log:
        process = subprocess.Popen(
            [sys.executable, paths["pyz"], "--config", paths["env"]],
            cwd=paths["dir"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            close_fds=True,
            start_new_session=True,  # setsid: no controlling terminal, no SIGHUP when SSH closes
        )
    _write_atomic(paths["pid"], f"{process.pid}\n", 0o600)
    deadline = time.monotonic() + EARLY_EXIT_SECONDS
    while time.monotonic() < deadline:
        code = process.poll()
        if code is not None:
            raise Failure(f"the agent exited at once with status {code}; {paths['log']} ends with:\n{_log_tail(paths)}")
        time.sleep(0.05)
    return process.pid


def _discard_uploads(paths: dict[str, str], nonce: str | None) -> None:
    now = time.time()
    for path in glob.glob(os.path.join(paths["dir"], ".agent.*.tmp")):
        with contextlib.suppress(OSError):
            if (nonce is not None and f".{nonce}." in os.path.basename(path)) or now - os.path.getmtime(
                path
            ) > STALE_UPLOAD_SECONDS:
                os.unlink(path)


def _start(paths: dict[str, str], manifest: dict[str, object], nonce: str) -> dict[str, object]:
    lock = os.open(paths["lock"], os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two installers of one agent: the second finds it running
        status = _status(paths, manifest)
        if status["running"] and status["current"]:
            _discard_uploads(paths, nonce)
            return dict(status, changed=False)
        stopped = _stop(paths) if status["running"] else None
        uploaded_pyz = os.path.join(paths["dir"], f".agent.pyz.{nonce}.tmp")
        uploaded_env = os.path.join(paths["dir"], f".agent.env.{nonce}.tmp")
        if os.path.exists(uploaded_pyz):
            if _sha256(uploaded_pyz) != manifest.get("pyz_sha256"):
                raise Failure("the uploaded zipapp does not have the expected SHA-256 (a truncated upload?)")
            os.chmod(uploaded_pyz, 0o700)
            os.replace(uploaded_pyz, paths["pyz"])
        elif _sha256(paths["pyz"]) != manifest.get("pyz_sha256"):
            raise Failure("the zipapp was not uploaded")
        if not os.path.exists(uploaded_env):
            raise Failure("the agent's config was not uploaded")
        os.chmod(uploaded_env, 0o600)
        os.replace(uploaded_env, paths["env"])
        _private_dir(paths["state"])
        _write_atomic(paths["manifest"], json.dumps(manifest, sort_keys=True), 0o600)
        systemctl = _systemctl()
        if systemctl is not None:
            pid, method = _start_systemd(systemctl, paths), "systemd"
        else:
            pid, method = _start_background(paths), "background"
        _discard_uploads(paths, nonce)
        return dict(_status(paths, manifest), changed=True, pid=pid, method=method, stopped=stopped)
    except BaseException:
        _discard_uploads(paths, nonce)
        raise
    finally:
        os.close(lock)


def main(argv: list[str]) -> int:
    try:
        # This runs on the machine's python3, not the server's: an old one gets a clear answer.
        if sys.version_info < (3, 9):  # noqa: UP036
            raise Failure(f"the agent needs Python >= 3.9; python3 on this machine is {sys.version.split()[0]}")
        if len(argv) < 3 or argv[1] not in ("check", "start"):
            raise Failure("usage: python3 - check MANIFEST | start MANIFEST NONCE")
        manifest = json.loads(argv[2])
        paths = _paths(str(manifest.get("agent_id", "")))
        _private_dir(BASE)
        _private_dir(paths["dir"])
        if argv[1] == "check":
            result = _status(paths, manifest)
        else:
            if len(argv) < 4 or not argv[3].isalnum():
                raise Failure("start needs the upload's nonce")
            result = _start(paths, manifest, argv[3])
    except Failure as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        return 1
    except (OSError, ValueError) as exc:
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
