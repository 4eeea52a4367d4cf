"""``graphenectl agent``: commands about agents; ``agent shell`` is a terminal on the agent's machine.

The terminal is a websocket to the server (``ws/agents/<id>/pty/``, token in the
``Authorization`` header), which relays it over the agent's own outbound connection: nothing
connects to the machine (I8).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import termios
import threading
import tty
import urllib.parse
import uuid
from typing import Annotated, Any

import typer
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Origin

from graphenectl import __version__
from graphenectl._client import _is_loopback
from graphenectl._cmd_write import parse_labels
from graphenectl._errors import EXIT_NOT_FOUND, EXIT_USAGE, CliError, NotFoundError, UsageError
from graphenectl._output import info, note, write
from graphenectl._resources import split_ref
from graphenectl._session import record_id, session

# The remote program ended without an exit code (it did not start, or its agent went away), as ssh.
EXIT_NO_STATUS = 255
EOF_CHAR = b"\x04"  # what a terminal sends for Ctrl-D: the remote shell reads end of input
EOF_REPEAT_SECONDS = 1.0
READ_BYTES = 16 * 1024

agent_app = typer.Typer(
    name="agent",
    help="Agents: the programs on machines that Graphene acts through (they dial out; nothing dials in).",
    no_args_is_help=True,
)


def resolve_agent(ref: str) -> dict[str, Any]:
    """An agent by id, ``agent/<id>`` or name (a name shared by several: the one connected)."""
    client = session.client()
    kind, ident = split_ref(ref, default="agent")
    if kind.name != "agent":
        raise UsageError(f"{ref!r} is not an agent; give an agent's name, its id or agent/<id>")
    try:
        uuid.UUID(ident)
    except ValueError:
        pass
    else:
        body: dict[str, Any] = client.get(f"agents/{ident}/")
        return body
    agents, _ = client.list("agents/", limit=None)
    named = [a for a in agents if a.get("name") == ident]
    if not named:
        raise NotFoundError(f"no agent named {ident!r}", hint="`graphenectl get agents` lists them")
    connected = [a for a in named if a.get("connected")]
    if len(named) == 1 or len(connected) == 1:
        return (connected or named)[0]
    ids = ", ".join(str(a["id"]) for a in named)
    raise UsageError(f"{len(named)} agents are named {ident!r} ({ids}); give the id of the one you mean")


def _size(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        size = shutil.get_terminal_size()
    return size.columns, size.lines


def _refusal(code: int | None, detail: str, agent: str) -> CliError:
    if code == 4401:
        return CliError(f"the server refused the token ({detail}); log in again with `graphenectl login --token-stdin`")
    if code == 4403:
        return CliError(f"permission denied: {detail}", hint="an administrator can grant agents.open_terminal")
    if code == 4404:
        return CliError(detail or f"no agent {agent}", exit_code=EXIT_NOT_FOUND)
    if code == 4400:
        return CliError(detail, exit_code=EXIT_USAGE)
    return CliError(f"no terminal on {agent}: {detail or f'the server closed the connection ({code})'}")


class _Stdin:
    """Reads stdin in a thread (a terminal, a pipe or a file alike) into the loop's queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self.loop, self.fd = loop, fd
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=16)  # bounded: a fast pipe waits

    def start(self) -> None:
        threading.Thread(target=self._read, name="stdin", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.fd, READ_BYTES)
            except OSError:
                data = b""
            try:
                asyncio.run_coroutine_threadsafe(self.queue.put(data), self.loop).result()
            except (RuntimeError, asyncio.CancelledError):  # the loop is gone: the session ended
                return
            if not data:
                return


async def _session(url: str, headers: dict[str, str], origin: str, loopback: bool, agent: str) -> int:
    loop = asyncio.get_running_loop()
    stdin_fd = sys.stdin.fileno()
    interactive = os.isatty(stdin_fd)
    try:
        ws = await connect(
            url,
            additional_headers=headers,
            origin=Origin(origin),
            # wss: verified as the REST requests are (the context's pinned CA, or the system's).
            ssl=session.client().ssl_context if url.startswith("wss://") else None,
            proxy=None if loopback else True,
            user_agent_header=f"graphenectl/{__version__}",
            open_timeout=session.timeout,
            max_size=1024 * 1024,
            ping_interval=20,
        )
    except InvalidStatus as exc:
        raise CliError(
            f"the server answered HTTP {exc.response.status_code} instead of opening the terminal's websocket "
            "(is this host in the server's GRAPHENE_ALLOWED_HOSTS?)"
        ) from None
    except (OSError, InvalidHandshake, TimeoutError) as exc:
        raise session.client()._unreachable(exc) from None
    async with ws:
        first = await _first(ws, agent)
        if first.get("type") != "opened":
            raise CliError(f"unexpected answer from the server: {first}")
        saved = termios.tcgetattr(stdin_fd) if interactive else None
        if saved is not None:
            tty.setraw(stdin_fd)  # every key (Ctrl-C too) goes to the remote program
        try:
            if interactive:
                size = _Size(ws, stdin_fd)
                loop.add_signal_handler(signal.SIGWINCH, lambda: asyncio.ensure_future(size.check()))
            reader = _Stdin(loop, stdin_fd)
            reader.start()
            pump = asyncio.ensure_future(_pump_input(ws, reader, size if interactive else None))
            try:
                end = await _pump_output(ws)
            finally:
                pump.cancel()
        finally:
            if interactive:
                loop.remove_signal_handler(signal.SIGWINCH)
            if saved is not None:
                termios.tcsetattr(stdin_fd, termios.TCSADRAIN, saved)
    if end is None:
        raise CliError(
            f"the connection to the server ended before the terminal on {agent} did", exit_code=EXIT_NO_STATUS
        )
    if end.get("exit_code") is None:
        raise CliError(f"the terminal on {agent} ended: {end.get('error') or 'no exit code'}", exit_code=EXIT_NO_STATUS)
    return int(end["exit_code"])


async def _first(ws: ClientConnection, agent: str) -> dict[str, Any]:
    try:
        raw = await ws.recv()
    except ConnectionClosed:
        code = ws.close_code
        raise _refusal(code, ws.close_reason or "", agent) from None
    message: dict[str, Any] = json.loads(raw)
    if message.get("type") == "error":
        with contextlib.suppress(ConnectionClosed, asyncio.TimeoutError):
            await asyncio.wait_for(ws.wait_closed(), 5)
        raise _refusal(message.get("code") or ws.close_code, str(message.get("error", "")), agent)
    return message


class _Size:
    """The local terminal's size, sent when it changes: on SIGWINCH, and before each input (the
    signal and the next keys race, and keys typed after a resize must meet the new size)."""

    def __init__(self, ws: ClientConnection, fd: int) -> None:
        self.ws, self.fd = ws, fd
        self.sent = _size(fd)

    async def check(self) -> None:
        current = _size(self.fd)
        if current != self.sent:
            self.sent = current
            with contextlib.suppress(ConnectionClosed):
                await self.ws.send(json.dumps({"type": "resize", "cols": current[0], "rows": current[1]}))


async def _pump_input(ws: ClientConnection, reader: _Stdin, size: _Size | None) -> None:
    with contextlib.suppress(ConnectionClosed):
        while True:
            data = await reader.queue.get()
            if not data:
                if size is None:  # piped input ran out: end of input for the remote shell, as Ctrl-D
                    # Again every second until the program ends (this task is cancelled then): a
                    # Ctrl-D that reaches the terminal while the shell runs a command, between two
                    # reads of its line editor, can be lost when it switches terminal modes.
                    while True:
                        await ws.send(EOF_CHAR)
                        await asyncio.sleep(EOF_REPEAT_SECONDS)
                return
            if size is not None:
                await size.check()
            await ws.send(data)


async def _pump_output(ws: ClientConnection) -> dict[str, Any] | None:
    out = sys.stdout.buffer
    try:
        async for message in ws:
            if isinstance(message, bytes):
                out.write(message)
                out.flush()
                continue
            body = json.loads(message)
            if body.get("type") == "exit":
                return dict(body)
            if body.get("type") == "error":
                print(f"graphenectl: {body.get('error')}", file=sys.stderr)
    except ConnectionClosed:
        pass
    return None


CREATE_HELP = (
    "Declare an agent and print how to install it: a shell script (default) or, with --cloud-init, "
    "#cloud-config user data.\n\n"
    "stdout carries only the install data, which holds a single-use bootstrap token (a secret until the "
    "agent has used it, valid for an hour by default): pipe it to a file or to your provisioning tool; "
    "nothing else prints it. The script needs sh and python3 (>= 3.9) on the machine, downloads the agent "
    "from the server, writes its config (mode 0600) and starts it; the agent dials out, and its record "
    "becomes ready when it says hello. Creating an existing agent again issues a fresh token.\n\n"
    "The agent belongs to the stand root 'agents' unless --owner names another owner. Needs the "
    "agents.add_agent permission.\n\n"
    "Examples: graphenectl agent create builder-1 -l pool=ci > install.sh && scp install.sh builder-1: \n"
    "          graphenectl agent create web-1 --cloud-init > user-data.yaml"
)


@agent_app.command("create", help=CREATE_HELP)
def create(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the agent's name, unique among its owner's agents")],
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="k=v (repeatable)")] = None,
    owner: Annotated[
        str | None,
        typer.Option(
            "--owner", help="its owner: a record id, run/<id> or stand/<pipeline> (default: stand root 'agents')"
        ),
    ] = None,
    cloud_init: Annotated[
        bool, typer.Option("--cloud-init", help="print #cloud-config user data instead of the shell script")
    ] = False,
) -> None:
    """Declare an agent and print its install data (see CREATE_HELP)."""
    body: dict[str, Any] = {"name": name, "labels": parse_labels(label or [])}
    if owner:
        body["owner"] = record_id(owner, owner=True)
    response = session.client().request("POST", "agents/", body=body)
    answer: dict[str, Any] = response.body
    agent = answer["agent"]
    write(answer["cloud_config"] if cloud_init else answer["install_script"])
    verb = "created" if response.status == 201 else "exists; a fresh bootstrap token was issued"
    until = f" until {answer['bootstrap_expires_at']}" if answer.get("bootstrap_expires_at") else ""
    form = "cloud-init user data" if cloud_init else "install script"
    note(f"agent/{agent['id']} {verb}: {agent['name']} (phase {agent['phase']})")
    info(
        f"the {form} on stdout holds a single-use bootstrap token, valid{until}: keep it secret. "
        f"Then: graphenectl get agents · graphenectl describe agent/{agent['id']}"
    )


SHELL_HELP = (
    "A terminal on the agent's machine, through the agent's own connection.\n\n"
    "Runs the login shell of the agent's user (or --command) in a PTY on the machine. Your terminal is in raw "
    "mode until it ends (every key, Ctrl-C too, goes to the remote program) and the remote size follows yours. "
    "When stdin is not a terminal (a pipe, a file), the input is sent as it comes and its end as Ctrl-D.\n\n"
    "Needs the agents.open_terminal permission; who opened and closed each terminal is recorded as events on "
    "the agent. Exits with the remote program's exit code (255 when it ended without one: it did not start, "
    "or the agent went away).\n\n"
    "Examples: graphenectl agent shell builder-1\n"
    "          echo 'uname -a' | graphenectl agent shell agent/<id>\n"
    "          graphenectl agent shell builder-1 --command 'journalctl -f'"
)


@agent_app.command("shell", help=SHELL_HELP)
def shell(
    agent: Annotated[str, typer.Argument(metavar="NAME_OR_ID", help="the agent: its name, its id, or agent/<id>")],
    command: Annotated[
        str | None,
        typer.Option("--command", "-c", help="run this shell line ($SHELL -c on the machine) instead of a login shell"),
    ] = None,
) -> None:
    """A terminal on the agent's machine (see SHELL_HELP)."""
    target = session.target()
    record = resolve_agent(agent)
    label = f"{record.get('name') or record['id']} ({record['id']})"
    cols, rows = _size(sys.stdin.fileno() if os.isatty(sys.stdin.fileno()) else sys.stdout.fileno())
    params: dict[str, str | int] = {"cols": cols, "rows": rows, "term": os.environ.get("TERM") or "xterm-256color"}
    if command:
        params["command"] = command
    parts = urllib.parse.urlsplit(target.server)
    scheme = "wss" if parts.scheme == "https" else "ws"
    url = f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}/ws/agents/{record['id']}/pty/?{urllib.parse.urlencode(params)}"
    headers = {"Authorization": f"Token {target.token}"}
    origin = f"{parts.scheme}://{parts.netloc}"
    code = asyncio.run(_session(url, headers, origin, _is_loopback(parts.hostname or ""), label))
    raise typer.Exit(code)
