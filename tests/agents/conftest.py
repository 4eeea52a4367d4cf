"""Real processes for the agent tests: the web server (daphne) and agents, all on loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from rest_framework.authtoken.models import Token

from apps.agents import services
from apps.agents.models import AgentCommand
from apps.records.models import Record
from tests.agents.sshd import SSHServer
from tests.conftest import REPO, process_env, wait_for

CHANNEL_LAYER_URL = os.environ.get("GRAPHENE_TEST_AGENTS_CHANNEL_LAYER_URL", "redis://127.0.0.1:6379/13")
AGENT_SRC = REPO / "agent"
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http(method: str, url: str, *, token: str | None = None, body: Any = None) -> tuple[int, Any]:
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Token {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310  # http:// only
    try:
        with _opener.open(request, timeout=30) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw[:1] in (b"{", b"[") else raw
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


class WebServer:
    """daphne serving the project against this test's database, with the Redis channel layer."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / "web.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WebServer:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
                 "graphene_project.asgi:application"],
                cwd=REPO,
                env=process_env(
                    DJANGO_SETTINGS_MODULE="tests.agents.web_settings",
                    GRAPHENE_TEST_AGENTS_CHANNEL_LAYER_URL=CHANNEL_LAYER_URL,
                    GRAPHENE_AGENT_SERVER_URL=self.url,
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        wait_for(self._ready, timeout=60, what=f"daphne on port {self.port} (log {self.log})")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"daphne exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            status, _ = http("GET", f"{self.url}/healthz")
        except OSError:
            return False
        return status == 200

    def kill(self) -> None:
        """SIGKILL, as a crash would: no close frames, no disconnect handlers."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


class AgentProcess:
    """``python -m graphene_agent`` (or a zipapp) with a 0600 config file in its own state dir."""

    def __init__(
        self,
        directory: Path,
        *,
        server_url: str,
        agent_id: Any,
        bootstrap_token: str | None,
        command: list[str] | None = None,
    ) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state_dir = directory / "state"
        self.config = directory / "agent.env"
        self.log = directory / "agent.log"
        lines = [
            f"GRAPHENE_AGENT_SERVER={server_url}",
            f"GRAPHENE_AGENT_ID={agent_id}",
            f"GRAPHENE_AGENT_STATE_DIR={self.state_dir}",
            "GRAPHENE_AGENT_BACKOFF_BASE_SECONDS=0.2",
            "GRAPHENE_AGENT_BACKOFF_MAX_SECONDS=1.5",
            "GRAPHENE_AGENT_LABELS=suite=agents",
        ]
        if bootstrap_token:
            lines.append(f"GRAPHENE_AGENT_BOOTSTRAP_TOKEN={bootstrap_token}")
        fd = os.open(self.config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, ("\n".join(lines) + "\n").encode())
        os.close(fd)
        self.command = command or [sys.executable, "-m", "graphene_agent"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        # A clean environment: nothing of the test session's settings, only the agent's source.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(AGENT_SRC), "HOME": str(self.dir)}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*self.command, "--config", str(self.config)],
                cwd=self.dir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_exit(self, timeout: float = 30) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the agent did not exit within {timeout}s:\n{self.output()[-3000:]}") from None

    def kill(self) -> None:
        """SIGKILL the agent process only (a command it runs has its own process group)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def listening_sockets(pid: int) -> list[str]:
    """TCP/UDP sockets in LISTEN state (or bound UDP) owned by ``pid``, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            listening = state == "0A" if table.startswith("tcp") else state == "07"
            if inode in inodes and listening:
                found.append(f"{table} {local}")
    return found


def wait_phase(record: Record, phase: str, timeout: float = 30) -> Record:
    def reached() -> Record | None:
        fresh = Record.objects.get(pk=record.pk)
        return fresh if fresh.phase == phase else None

    fresh = wait_for(reached, timeout=timeout, what=f"{record} to be {phase}")
    assert fresh is not None
    return fresh


def wait_command(command: AgentCommand, timeout: float = 30) -> AgentCommand:
    def finished() -> AgentCommand | None:
        fresh = AgentCommand.objects.get(pk=command.pk)
        return fresh if fresh.is_finished else None

    fresh = wait_for(finished, timeout=timeout, what=f"command {command.pk} to finish")
    assert fresh is not None
    return fresh


def is_private(path: Path, mode: int) -> bool:
    return stat.S_IMODE(path.stat().st_mode) == mode


@pytest.fixture
def redis_layer(settings: Any) -> None:
    """This process publishes command hints where the web process listens."""
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": CHANNEL_LAYER_URL, "socket_timeout": 30}]},
        }
    }


@pytest.fixture
def web(transactional_db: None, redis_layer: None, tmp_path: Path) -> Iterator[WebServer]:
    server = WebServer(tmp_path).start()
    yield server
    server.kill()  # its agents are stopped by now; a graceful shutdown would only cost time


@pytest.fixture
def stand() -> Record:
    from apps.records.services import record_create_root

    return record_create_root(kind="graphene.stand", name=f"agents-{time.monotonic_ns()}")


@pytest.fixture
def agents(web: WebServer, stand: Record, tmp_path: Path) -> Iterator[Callable[..., tuple[Record, AgentProcess]]]:
    """Declare an agent record and start a real agent process with its bootstrap token."""
    started: list[AgentProcess] = []

    def start(name: str, *, run: bool = True, command: list[str] | None = None) -> tuple[Record, AgentProcess]:
        install = services.agent_declare(owner=stand, name=name, labels={"suite": "agents"}, server_url=web.url)
        process = AgentProcess(
            tmp_path / name,
            server_url=web.url,
            agent_id=install.record.pk,
            bootstrap_token=install.bootstrap_token,
            command=command,
        )
        started.append(process)
        if run:
            process.start()
        return install.record, process

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def operator(django_user_model: Any) -> str:
    """An API token of a user allowed to run commands on agents."""
    user = django_user_model.objects.create_user(username="operator", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="add_agentcommand", content_type__app_label="agents"))
    return Token.objects.create(user=user).key


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SSHServer]:
    """A real OpenSSH server on loopback; agents installed through it are killed at the end."""
    server = SSHServer(tmp_path / "sshd").start()
    yield server
    server.stop()
