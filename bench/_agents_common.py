"""Plumbing shared by the agent benchmarks (``agent_exec``, ``agent_logs``).

Builds on ``bench/_runs_common.runs_environment`` (own database, Redis db, data directory;
the settings module ``bench._runs_settings`` with the production Redis channel layer) and
adds the real processes of the agent path, all on loopback:

* ``Web``: ``daphne`` serving the project (the agent gateway, the REST API and its log stream)
  with the benchmark's environment, in its own process group;
* ``AgentProc``: the agent as it ships — the zipapp (``apps.agents.bundle``) run by the base
  interpreter (no virtualenv), with a 0600 env file holding its bootstrap token;
* ``Sshd``: a real OpenSSH server (``sshd -D``, generated ed25519 host and user keys), as
  ``tests/agents/sshd.py`` starts one;
* ``CommandWaiter``: the hint a waiter gets when a command row is finished — the
  ``agent.command.changed`` message ``command_finish`` publishes on commit to the channel
  layer group ``agents`` — received on an event loop of its own in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._common import Bench, wait_until  # noqa: E402

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes] | None, *, grace: float = 10.0) -> None:
    """SIGTERM the process group, SIGKILL it after ``grace``."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of one live process (0 if it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Web:
    """daphne on 127.0.0.1:<free port> with the benchmark's environment."""

    bench: Bench
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.bench.data_dir / "web.log"

    def start(self, *, timeout: float = 60.0) -> Web:
        env = {**os.environ, "GRAPHENE_AGENT_SERVER_URL": self.url}
        args = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port)]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*args, "graphene_project.asgi:application"],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(self._ready, timeout=timeout, interval=0.1, what=f"daphne on port {self.port} (log {self.log})")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"daphne exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            with _opener.open(f"{self.url}/healthz", timeout=5) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        stop_process(self.proc)


def base_interpreter() -> str:
    """The interpreter behind the virtualenv: what ``python3`` is on a bare machine."""
    return str(Path(getattr(sys, "_base_executable", None) or sys.executable).resolve())


@dataclass
class AgentProc:
    """The shipped zipapp as an installed agent runs it, with its own state directory."""

    record: Any
    directory: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.directory / "agent.log"

    @classmethod
    def declare_and_start(cls, bench: Bench, web: Web, *, name: str, timeout: float = 60.0) -> AgentProc:
        from apps.agents import services
        from apps.agents.bundle import agent_bundle
        from apps.records.models import Record
        from apps.records.services import record_create_root

        stand = record_create_root(kind="graphene.stand", name=f"bench-{name}-{time.monotonic_ns()}")
        install = services.agent_declare(owner=stand, name=name, server_url=web.url)
        directory = bench.data_dir / f"agent-{name}"
        directory.mkdir(parents=True)
        config = directory / "agent.env"
        text = services.agent_env_file(
            record=install.record, bootstrap_token=install.bootstrap_token, server_url=web.url
        )
        text += f"GRAPHENE_AGENT_STATE_DIR={directory / 'state'}\nGRAPHENE_AGENT_LOG_LEVEL=WARNING\n"
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, text.encode())
        os.close(fd)
        agent = cls(record=install.record, directory=directory)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(directory)}
        with agent.log.open("ab") as out:
            agent.proc = subprocess.Popen(
                [base_interpreter(), str(agent_bundle().path), "--config", str(config)],
                cwd=directory,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def ready() -> bool:
            assert agent.proc is not None
            if agent.proc.poll() is not None:
                raise RuntimeError(f"the agent exited with {agent.proc.returncode}:\n{agent.log.read_text()[-3000:]}")
            return Record.objects.filter(pk=install.record.pk, phase="ready").exists()

        wait_until(ready, timeout=timeout, interval=0.1, what=f"agent {name} to be ready (log {agent.log})")
        return agent

    def stop(self) -> None:
        stop_process(self.proc)


@dataclass
class Sshd:
    """``sshd -D -e`` on 127.0.0.1:<free port> accepting one generated ed25519 user key."""

    directory: Path
    port: int = field(default_factory=free_port)
    user: str = field(default_factory=getpass.getuser)
    host_key_private: str = ""
    host_key_public: str = ""
    user_key_private: str = ""
    proc: subprocess.Popen[bytes] | None = None

    def _write(self, name: str, content: str) -> Path:
        path = self.directory / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, content.encode())
        os.close(fd)
        return path

    def start(self, *, timeout: float = 30.0) -> Sshd:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519

        def keypair() -> tuple[str, str]:
            key = ed25519.Ed25519PrivateKey.generate()
            private = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
            ).decode()
            public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
            return private, public.decode()

        binary = next(
            (p for p in ("/usr/sbin/sshd", "/usr/local/sbin/sshd") if os.access(p, os.X_OK)), shutil.which("sshd")
        )
        if binary is None:
            raise RuntimeError("sshd is not installed: apt-get install openssh-server (.ci/run installs it)")
        self.directory.mkdir(parents=True, exist_ok=True)
        home = self.directory / "home"
        home.mkdir(exist_ok=True)
        self.host_key_private, self.host_key_public = keypair()
        self.user_key_private, user_public = keypair()
        host_key = self._write("ssh_host_ed25519_key", self.host_key_private)
        authorized = self._write("authorized_keys", user_public + "\n")
        config = self._write(
            "sshd_config",
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {host_key}",
                    "PidFile none",
                    f"AuthorizedKeysFile {authorized}",
                    "StrictModes no",
                    "UsePAM no",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    f"SetEnv HOME={home}",
                    "MaxStartups 100",
                    "LogLevel ERROR",
                    "",
                ]
            ),
        )
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
        with (self.directory / "sshd.log").open("ab") as out:
            self.proc = subprocess.Popen(
                [binary, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(self._answers, timeout=timeout, interval=0.1, what=f"sshd on port {self.port}")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            log = (self.directory / "sshd.log").read_text()[-3000:]
            raise RuntimeError(f"sshd exited with {self.proc.returncode}:\n{log}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
                return sock.recv(64).startswith(b"SSH-2.0-")
        except OSError:
            return False

    def client(self) -> Any:
        """A connected, authenticated paramiko client (host key pinned, no agent, no key files)."""
        import io

        import paramiko

        client = paramiko.SSHClient()
        kind, blob = self.host_key_public.split()[:2]
        client.get_host_keys().add(f"[127.0.0.1]:{self.port}", kind, paramiko.Ed25519Key(data=_b64(blob)))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        key = paramiko.Ed25519Key.from_private_key(io.StringIO(self.user_key_private))
        client.connect(
            "127.0.0.1",
            port=self.port,
            username=self.user,
            pkey=key,
            allow_agent=False,
            look_for_keys=False,
            timeout=20,
        )
        return client

    def stop(self) -> None:
        stop_process(self.proc)


def _b64(text: str) -> bytes:
    import base64

    return base64.b64decode(text)


class CommandWaiter:
    """Hints from the channel layer group ``agents``: a command row was finished (committed).

    What a waiter in another process has: ``command_finish`` publishes
    ``agent.command.changed`` with the command's id after its transaction commits.
    """

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._events: dict[str, threading.Event] = {}
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="command-waiter", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("the waiter did not join the channel layer group in 30 s")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._listen())

    async def _listen(self) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        channel = await layer.new_channel("bench-waiter.")
        await layer.group_add("agents", channel)
        self._ready.set()
        while True:
            message = await layer.receive(channel)
            if message.get("event") != "agent.command.changed":
                continue
            command_id = str(message.get("id"))
            with self._lock:
                self._seen[command_id] = time.perf_counter()
                event = self._events.get(command_id)
            if event is not None:
                event.set()

    def expect(self, command_id: str) -> threading.Event:
        with self._lock:
            event = self._events.setdefault(command_id, threading.Event())
            if command_id in self._seen:
                event.set()
        return event

    def seen_at(self, command_id: str) -> float:
        with self._lock:
            self._events.pop(command_id, None)
            return self._seen.pop(command_id)
