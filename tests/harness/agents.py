"""Agents as real processes: ``python -m graphene_agent`` (or a zipapp) with its own config and state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness.processes import REPO

AGENT_SRC = REPO / "agent"


class AgentProcess:
    """``python -m graphene_agent`` (or a zipapp) with a 0600 config file in its own state dir;
    ``server_ca`` is the CA it pins for a wss:// server, as its install data would give it."""

    def __init__(
        self,
        directory: Path,
        *,
        server_url: str,
        agent_id: Any,
        bootstrap_token: str | None,
        command: list[str] | None = None,
        server_ca: str = "",
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
        if server_ca:  # the CA the install data carries (apps.agents.services.agent_server_ca)
            lines.append(f"GRAPHENE_AGENT_SERVER_CA={server_ca}")
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
