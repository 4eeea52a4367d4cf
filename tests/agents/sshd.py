"""A real OpenSSH server on a loopback port, for the SSH install tests.

``sshd -D -e`` runs in the foreground as a child of the test (no system service), with a
generated ed25519 host key and one authorized, generated user key. ``SetEnv HOME=...`` gives
the sessions a private home directory under the test's tmp_path, so that what an install
writes to ``~/.graphene-agent`` is the test's to inspect and to clean up.

With a ``launcher`` (e.g. ``docker exec <container>``) the same sshd, config and keys run
inside a machine that shares this network namespace and sees ``directory`` at the same path
(a container started with ``--network host`` and ``directory`` bind-mounted): the test then
logs in to that machine, as ``user``.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from tests.harness.net import free_port
from tests.harness.wait import wait_for

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")


@dataclass(frozen=True)
class KeyPair:
    private_openssh: str  # the private key file's content (what the secret store holds)
    public_line: str  # "ssh-ed25519 AAAA..."


def ed25519_keypair() -> KeyPair:
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return KeyPair(private_openssh=private, public_line=public.decode())


def sshd_binary() -> str:
    for candidate in SSHD_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("sshd")
    if found is None:
        raise AssertionError("sshd is not installed: apt-get install openssh-server (.ci/run installs it)")
    return found


class SSHServer:
    """``sshd`` on 127.0.0.1:<free port>, accepting ``user_key`` for ``user`` (the current user)."""

    def __init__(self, directory: Path, *, user: str | None = None, launcher: Sequence[str] = ()) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.home = directory / "home"
        self.home.mkdir()
        self.host = "127.0.0.1"
        self.port = free_port()
        self.user = user or getpass.getuser()
        self.launcher = list(launcher)  # prefix of the sshd command: where it runs (here if empty)
        self.host_key = ed25519_keypair()
        self.user_key = ed25519_keypair()
        self.log = directory / "sshd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def _write(self, name: str, content: str, mode: int) -> Path:
        path = self.dir / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        os.write(fd, content.encode())
        os.close(fd)
        return path

    def start(self) -> SSHServer:
        host_key = self._write("ssh_host_ed25519_key", self.host_key.private_openssh, 0o600)
        authorized = self._write("authorized_keys", self.user_key.public_line + "\n", 0o600)
        config = self._write(
            "sshd_config",
            "\n".join(
                [
                    f"Port {self.port}",
                    f"ListenAddress {self.host}",
                    f"HostKey {host_key}",
                    "PidFile none",
                    f"AuthorizedKeysFile {authorized}",
                    "StrictModes no",
                    "UsePAM no",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "Subsystem sftp internal-sftp",
                    f"SetEnv HOME={self.home}",
                    "LogLevel VERBOSE",
                    "",
                ]
            ),
            0o600,
        )
        if os.geteuid() == 0 and not self.launcher:
            # sshd running as root insists on its privilege separation directory (a launched
            # sshd's machine provides its own).
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*self.launcher, sshd_binary(), "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(self._answers, timeout=30, what=f"sshd on port {self.port} (log {self.log})")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"sshd exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            with socket.create_connection((self.host, self.port), timeout=2) as sock:
                return sock.recv(64).startswith(b"SSH-2.0-")
        except OSError:
            return False

    def connections(self) -> int:
        """Connections sshd accepted so far (from its log)."""
        return self.log.read_text(errors="replace").count("Connection from ")

    def agent_processes(self) -> list[int]:
        """Live agent processes started from this server's home (found in /proc by their command line)."""
        marker = str(self.home / ".graphene-agent")
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if marker in command and "agent.pyz" in command and state != "Z":
                found.append(int(entry.name))
        return sorted(found)

    def stop(self) -> None:
        for pid in self.agent_processes():  # started through this server, for this test only
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
