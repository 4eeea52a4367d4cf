"""Terminals (``ws/agents/<id>/pty/``): a PTY on the agent's machine, relayed over the agent's
own connection, with real daphne, a real agent process and real shells."""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import struct
import subprocess
import termios
import time
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, ConnectionClosedError
from websockets.sync.client import ClientConnection
from websockets.typing import Origin

from apps.accounts import services as accounts
from apps.core import rbac
from apps.core.models import Role
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from tests import factories
from tests.agents.conftest import wait_phase
from tests.conftest import wait_for
from tests.harness.agents import AgentProcess
from tests.harness.embedded import graphenectl_argv
from tests.harness.web import WebServer
from tests.harness.ws import open_ws

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

Agents = Callable[..., tuple[Record, AgentProcess]]


@pytest.fixture
def admin_token(django_user_model: Any) -> str:
    """A superuser: may open terminals everywhere."""
    user = django_user_model.objects.create_superuser(username="root", password="pw")
    return factories.api_token(user)


@pytest.fixture
def terminal_token(django_user_model: Any) -> str:
    """A plain user who may open terminals on agents of the default namespace (a custom role)."""
    user = django_user_model.objects.create_user(username="ops", password="pw")
    if not Role.objects.filter(name="terminal-user").exists():
        rbac.role_create(
            name="terminal-user",
            rules=[{"verbs": ["get", "list", "watch", "open_terminal"], "resources": ["agents", "records"]}],
            actor=None,
        )
    factories.bind(user, "terminal-user")
    return factories.api_token(user)


class Terminal:
    """A websocket client of the terminal, as the Studio or graphenectl is."""

    def __init__(self, web: WebServer, agent_id: Any, token: str | None, **params: Any) -> None:
        query = urllib.parse.urlencode(params)
        headers = {"Authorization": f"Token {token}"} if token else {}
        self.ws: ClientConnection = open_ws(
            f"{web.ws_url}/ws/agents/{agent_id}/pty/?{query}",
            log=web.log,
            origin=Origin(web.url),
            additional_headers=headers,
        )
        self.output = b""

    def control(self, timeout: float = 30) -> dict[str, Any]:
        """The next JSON message, collecting terminal output that comes before it.

        A refusal is an error message and then a close with the same code and text as reason.
        When the server's end is gone before this client has answered the close, the websockets
        client drops the frames it read with it (its reply fails: ``SSLEOFError``), the message
        among them: the refusal is then read from the close."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                message = self.ws.recv(timeout=max(0.01, deadline - time.monotonic()))
            except ConnectionClosedError:
                code, reason = self.ws.close_code, self.ws.close_reason
                if code is None or code < 4000 or not isinstance(self.ws.recv_exc, OSError):
                    raise
                return {"type": "error", "error": reason, "code": code}
            if isinstance(message, bytes):
                self.output += message
                continue
            body: dict[str, Any] = json.loads(message)
            return body

    def type(self, text: str) -> None:
        self.ws.send(text.encode())

    def resize(self, cols: int, rows: int) -> None:
        self.ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    def read_until(self, needle: bytes, timeout: float = 30) -> bytes:
        deadline = time.monotonic() + timeout
        while needle not in self.output:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out waiting for {needle!r}; the terminal showed {self.output[-2000:]!r}")
            message = self.ws.recv(timeout=remaining)
            assert isinstance(message, bytes), f"expected output, got {message!r}"
            self.output += message
        return self.output

    def closed(self, timeout: float = 30) -> tuple[int | None, str]:
        deadline = time.monotonic() + timeout
        try:
            while True:
                message = self.ws.recv(timeout=max(0.01, deadline - time.monotonic()))
                if isinstance(message, bytes):
                    self.output += message
        except ConnectionClosed:
            pass
        return self.ws.close_code, self.ws.close_reason or ""


def refused(web: WebServer, agent_id: Any, token: str | None) -> tuple[dict[str, Any], int | None]:
    terminal = Terminal(web, agent_id, token)
    message = terminal.control()
    code, _ = terminal.closed()
    return message, code


def terminal_events(record: Record, reason: str) -> list[Event]:
    return list(Event.objects.filter(record=record, reason=reason).order_by("id"))


def pid_gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()  # the agent reaps its children: no zombie either


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_a_terminal_runs_commands_resizes_and_ends_with_the_exit_code(
    agents: Agents, web: WebServer, terminal_token: str
) -> None:
    record, agent = agents("term")
    wait_phase(record, Phase.READY)
    terminal = Terminal(web, record.pk, terminal_token, cols=80, rows=24)
    opened = terminal.control()
    assert opened["type"] == "opened", opened
    pid = opened["pid"]
    assert parent_of(pid) == agent.pid, "the shell is the agent's child, on the agent's machine"
    [event] = terminal_events(record, "TerminalOpened")
    assert event.type == EventType.TERMINAL
    assert event.actor is not None
    assert event.actor.username == "ops"
    assert event.data["pid"] == pid
    assert event.data["session"] == opened["session"]

    terminal.type("echo hello-$((6*7))\n")
    terminal.read_until(b"hello-42")  # the echo of the input shows $((6*7)), only the shell says 42

    terminal.resize(111, 33)
    terminal.type("stty size\n")
    terminal.read_until(b"33 111")

    terminal.type("exit 3\n")
    end = terminal.control()
    assert end["type"] == "exit", end
    assert (end["exit_code"], end["signal"], end["error"]) == (3, None, "")
    assert terminal.closed()[0] == 1000
    wait_for(lambda: pid_gone(pid), timeout=10, what=f"shell {pid} to be gone")
    [closed] = wait_for(lambda: terminal_events(record, "TerminalClosed"), timeout=10, what="TerminalClosed")
    assert closed.type == EventType.TERMINAL
    assert closed.data["exit_code"] == 3
    assert closed.data["user"] == "ops"
    assert closed.data["session"] == opened["session"]
    assert closed.data["duration_s"] > 0
    assert closed.actor is not None
    assert closed.actor.username == "ops"


def test_closing_the_websocket_hangs_up_the_shell_on_the_machine(
    agents: Agents, web: WebServer, admin_token: str
) -> None:
    record, _ = agents("hangup")
    wait_phase(record, Phase.READY)
    terminal = Terminal(web, record.pk, admin_token, command="echo ready; sleep 600")
    opened = terminal.control()
    assert opened["type"] == "opened", opened
    terminal.read_until(b"ready")
    pid = opened["pid"]
    assert not pid_gone(pid)

    terminal.ws.close()
    wait_for(lambda: pid_gone(pid), timeout=15, what=f"shell {pid} to be killed after the close")
    [closed] = wait_for(lambda: terminal_events(record, "TerminalClosed"), timeout=10, what="TerminalClosed")
    assert closed.data["closed_by"] == "user"
    assert closed.data["signal"] is not None, "hung up, not exited by itself"
    assert closed.data["user"] == "root"


def test_revoking_the_token_hangs_up_its_terminals(agents: Agents, web: WebServer, django_user_model: Any) -> None:
    """A terminal is the most a token opens: revoking the token closes it (4401, saying why) and
    the shell on the machine is hung up, as when the user closes it."""
    user = django_user_model.objects.create_superuser(username="leaky", password="pw")
    issued = accounts.access_token_issue(user=user, comment="leaked")
    record, _ = agents("revoked-term")
    wait_phase(record, Phase.READY)
    terminal = Terminal(web, record.pk, issued.key, command="echo ready; sleep 600")
    opened = terminal.control()
    assert opened["type"] == "opened", opened
    terminal.read_until(b"ready")

    accounts.access_token_revoke(token=issued.token, reason="leaked in a log")
    error = terminal.control(timeout=15)
    assert error["type"] == "error"
    assert error["code"] == 4401
    assert "was revoked at" in error["error"]
    assert "leaked in a log" in error["error"]
    assert terminal.closed()[0] == 4401
    wait_for(lambda: pid_gone(opened["pid"]), timeout=15, what="the shell to be hung up after the revocation")
    [closed] = wait_for(lambda: terminal_events(record, "TerminalClosed"), timeout=10, what="TerminalClosed")
    assert closed.data["user"] == "leaky"


def test_large_output_arrives_whole_and_in_order(agents: Agents, web: WebServer, admin_token: str) -> None:
    """Megabytes of output cross in acknowledged chunks: nothing dropped, nothing reordered."""
    record, _ = agents("firehose")
    wait_phase(record, Phase.READY)
    terminal = Terminal(web, record.pk, admin_token, command="seq 1 300000")
    assert terminal.control()["type"] == "opened"
    end = terminal.control(timeout=60)
    assert end["exit_code"] == 0, end
    lines = terminal.output.decode().split("\r\n")
    assert lines[-1] == ""
    assert lines[:-1] == [str(i) for i in range(1, 300001)]


def test_a_user_without_the_permission_is_refused_and_the_refusal_is_an_event(
    agents: Agents, web: WebServer, operator: str
) -> None:
    record, agent = agents("guarded")
    wait_phase(record, Phase.READY)
    message, code = refused(web, record.pk, operator)  # may run commands, but not open a terminal
    assert code == 4403
    assert message["type"] == "error"
    assert "may not open_terminal agents" in message["error"]
    [event] = terminal_events(record, "TerminalRefused")
    assert event.type == EventType.ERROR
    assert event.data == {"user": "operator", "why": "permission"}
    assert event.actor is not None
    assert event.actor.username == "operator"
    assert not terminal_events(record, "TerminalOpened")
    assert "terminal" not in agent.output(), "nothing reached the agent"


def test_unauthenticated_unknown_and_disconnected_agents_are_refused(
    agents: Agents, web: WebServer, admin_token: str
) -> None:
    record, _ = agents("ready")
    wait_phase(record, Phase.READY)
    for token in (None, "not-a-token"):
        message, code = refused(web, record.pk, token)
        assert code == 4401, message
    message, code = refused(web, uuid.uuid4(), admin_token)
    assert (code, message["code"]) == (4404, 4404)
    assert "no agent" in message["error"]

    offline, _ = agents("offline", run=False)
    message, code = refused(web, offline.pk, admin_token)
    assert code == 4503
    assert "not connected" in message["error"]
    [event] = terminal_events(offline, "TerminalRefused")
    assert event.data["why"] == "not_connected"

    terminal = Terminal(web, record.pk, admin_token, cols=0)
    message = terminal.control()
    assert (terminal.closed()[0], message["code"]) == (4400, 4400)
    assert "cols" in message["error"]


def test_the_terminal_ends_when_its_agent_goes_away(agents: Agents, web: WebServer, admin_token: str) -> None:
    record, agent = agents("vanishing")
    wait_phase(record, Phase.READY)
    terminal = Terminal(web, record.pk, admin_token)
    opened = terminal.control()
    assert opened["type"] == "opened", opened
    agent.kill()  # SIGKILL: no goodbye; the kernel closes its end of the terminal
    end = terminal.control()
    assert end["type"] == "exit", end
    assert end["exit_code"] is None
    assert "disconnected" in end["error"]
    wait_for(lambda: pid_gone(opened["pid"]), timeout=15, what="the shell to die with its terminal")
    [closed] = wait_for(lambda: terminal_events(record, "TerminalClosed"), timeout=10, what="TerminalClosed")
    assert closed.data["error"] == "the agent disconnected"


def _ctl(web: WebServer, token: str, tmp_path: Path, *args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHENE_")}
    env.update(web.client_env(), GRAPHENE_TOKEN=token, XDG_CONFIG_HOME=str(tmp_path), NO_COLOR="1")
    env.update(COLUMNS="100", LINES="40")  # the size of "your terminal" when stdout is not one
    return subprocess.run(
        [*graphenectl_argv(), *args], input=stdin, capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_graphenectl_agent_shell_with_piped_input(
    agents: Agents, web: WebServer, terminal_token: str, operator: str, tmp_path: Path
) -> None:
    record, _ = agents("ctl-shell")
    wait_phase(record, Phase.READY)

    by_name = _ctl(web, terminal_token, tmp_path, "agent", "shell", "ctl-shell", stdin="echo hello-$((6*7))\nexit 3\n")
    assert by_name.returncode == 3, by_name.stderr
    assert "hello-42" in by_name.stdout

    # The end of piped input is the end of input for the remote shell (Ctrl-D): it exits 0.
    eof = _ctl(web, terminal_token, tmp_path, "agent", "shell", f"agent/{record.pk}", stdin="echo bye-$((1+1))\n")
    assert eof.returncode == 0, eof.stderr
    assert "bye-2" in eof.stdout

    command = _ctl(
        web, terminal_token, tmp_path, "agent", "shell", str(record.pk), "--command", "stty size; exit 5", stdin=""
    )
    assert command.returncode == 5, command.stderr
    assert "40 100" in command.stdout

    denied = _ctl(web, operator, tmp_path, "agent", "shell", "ctl-shell", stdin="")
    assert denied.returncode == 1
    assert "may not open_terminal agents" in denied.stderr

    missing = _ctl(web, terminal_token, tmp_path, "agent", "shell", "no-such-agent", stdin="")
    assert missing.returncode == 3
    assert "no agent named 'no-such-agent'" in missing.stderr
    assert len(terminal_events(record, "TerminalOpened")) == 3


class LocalTerminal:
    """A PTY for graphenectl itself, as a person's terminal emulator would give it."""

    def __init__(self, rows: int, cols: int) -> None:
        self.master, self.slave = os.openpty()
        self.resize(rows, cols)
        self.seen = b""

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def read_until(self, needle: bytes, timeout: float = 30) -> None:
        """Reads until ``needle`` shows (in what came since the start)."""
        deadline = time.monotonic() + timeout
        while needle not in self.seen:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out waiting for {needle!r}; the terminal showed {self.seen[-2000:]!r}")
            ready, _, _ = select.select([self.master], [], [], remaining)
            if ready:
                self.seen += os.read(self.master, 65536)

    def close(self) -> None:
        os.close(self.master)
        os.close(self.slave)


def _ctl_in(local: LocalTerminal, web: WebServer, token: str, tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHENE_") and k not in ("COLUMNS", "LINES")}
    env.update(web.client_env(), GRAPHENE_TOKEN=token, XDG_CONFIG_HOME=str(tmp_path), TERM="xterm")
    return subprocess.Popen(
        [*graphenectl_argv(), "agent", "shell", *args],
        stdin=local.slave,
        stdout=local.slave,
        stderr=local.slave,
        env=env,
    )


def test_graphenectl_agent_shell_in_a_terminal_is_raw_follows_the_size_and_restores_it(
    agents: Agents, web: WebServer, terminal_token: str, tmp_path: Path
) -> None:
    record, _ = agents("ctl-tty")
    wait_phase(record, Phase.READY)
    local = LocalTerminal(rows=30, cols=90)
    before = termios.tcgetattr(local.slave)
    proc = _ctl_in(local, web, terminal_token, tmp_path, "ctl-tty")
    try:
        wait_for(lambda: termios.tcgetattr(local.slave) != before, timeout=30, what="graphenectl to go raw")
        raw = termios.tcgetattr(local.slave)
        assert not raw[3] & (termios.ICANON | termios.ECHO), "keys go to the remote program as typed"
        os.write(local.master, b"echo $TERM; stty size\r")
        local.read_until(b"30 90")
        assert b"xterm\r\n" in local.seen
        local.resize(rows=40, cols=120)  # and no SIGWINCH yet: keys typed after a resize carry it
        os.write(local.master, b"stty size\r")
        local.read_until(b"40 120")
        os.write(local.master, b"exit 4\r")
        assert proc.wait(timeout=30) == 4
        assert termios.tcgetattr(local.slave) == before, "the local terminal is restored"

        # SIGWINCH alone resizes the remote terminal (its program gets SIGWINCH too), and Ctrl-C
        # is a key for the remote program, not a signal for graphenectl.
        local.seen = b""
        proc = _ctl_in(
            local,
            web,
            terminal_token,
            tmp_path,
            "ctl-tty",
            "--command",
            "trap 'stty size' WINCH; echo armed; while :; do sleep 0.1; done",
        )
        local.read_until(b"armed")
        local.resize(rows=50, cols=132)
        proc.send_signal(signal.SIGWINCH)  # what the kernel sends the terminal's foreground job
        local.read_until(b"50 132")
        os.write(local.master, b"\x03")
        assert proc.wait(timeout=30) == 130
        assert termios.tcgetattr(local.slave) == before
    finally:
        if proc.poll() is None:
            proc.kill()
        local.close()
