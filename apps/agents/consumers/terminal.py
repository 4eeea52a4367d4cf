"""The user's side of a terminal: ``ws/agents/<id>/pty/`` (``AgentTerminalConsumer``).

Terminals are relayed, not stored: this consumer sends ``pty.*`` messages straight to the
channel of the agent's current connection (``Agent.channel_name``), whose gateway consumer
forwards them to the agent and sends the agent's ``pty_*`` answers back here.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import uuid
from typing import Any
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncWebsocketConsumer

from apps.agents import selectors, services
from apps.agents.consumers.gateway import channel_send
from apps.core import access, validation
from apps.core.db import on_db_thread
from apps.core.errors import NotFound, ValidationFailed

logger = logging.getLogger(__name__)

# Close codes of ``ws/agents/<id>/pty/`` before the terminal opened (after it, the end is an
# ``exit`` message and a normal close).
CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_UNAVAILABLE = 4503  # the agent is not connected, or did not start the terminal
OPEN_TIMEOUT_SECONDS = 20.0
WATCH_SECONDS = 5.0
MAX_INPUT_FRAME = 64 * 1024
DEFAULT_TERM = "xterm-256color"


class TerminalRefused(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def _dimension(params: dict[str, str], name: str, default: int) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise TerminalRefused(CLOSE_BAD_REQUEST, f"{name}={raw!r} must be a whole number") from None
    if not 1 <= value <= 1000:
        raise TerminalRefused(CLOSE_BAD_REQUEST, f"{name}={value} must be between 1 and 1000")
    return value


def _terminal_params(query_string: bytes) -> dict[str, Any]:
    parsed = parse_qs(query_string.decode(errors="replace"))
    try:
        validation.check_params(parsed)  # the REST door's check: a NUL cannot reach the machine's shell
    except ValidationFailed as exc:
        raise TerminalRefused(CLOSE_BAD_REQUEST, exc.detail) from None
    params = {k: v[-1] for k, v in parsed.items()}
    term = params.get("term") or DEFAULT_TERM
    if len(term) > 64 or not all(c.isalnum() or c in "-_.+" for c in term):
        raise TerminalRefused(CLOSE_BAD_REQUEST, f"term={term[:64]!r} is not a terminal type")
    command = params.get("command") or None
    if command is not None and len(command) > 16 * 1024:
        raise TerminalRefused(CLOSE_BAD_REQUEST, "command is longer than 16 KiB")
    return {
        "cols": _dimension(params, "cols", 80),
        "rows": _dimension(params, "rows", 24),
        "command": command,
        "env": {"TERM": term},
    }


def _terminal_target(user: Any, agent_id: str) -> tuple[Any, str]:
    """The agent record and its connection's channel, or ``TerminalRefused`` (refusals are events)."""
    try:
        record = selectors.agent_get(user=user, agent_id=agent_id)
    except NotFound as exc:
        raise TerminalRefused(CLOSE_NOT_FOUND, exc.detail) from None
    if not selectors.agent_can_open_terminal(user=user, agent=record):
        detail = access.denial(user, "open_terminal", "agents", record.namespace).detail
        services.terminal_refused(record_id=record.pk, user=user, why="permission", message=detail)
        raise TerminalRefused(CLOSE_FORBIDDEN, detail)
    connection = selectors.agent_connection(record=record)
    if connection is None:
        detail = f"agent {record.name} ({record.pk}) is not connected; a terminal needs a connected agent"
        services.terminal_refused(record_id=record.pk, user=user, why="not_connected", message=detail)
        raise TerminalRefused(CLOSE_UNAVAILABLE, detail)
    return record, connection.channel_name


class AgentTerminalConsumer(AsyncWebsocketConsumer):  # type: ignore[misc,unused-ignore]  # channels is untyped
    """``ws/agents/<id>/pty/``: a terminal on the agent's machine, for a user who may
    ``open_terminal`` agents in its namespace.

    Authenticated by the session cookie (the Studio) or ``Authorization: Token <key>``
    (graphenectl). Query parameters: ``cols`` and ``rows`` (default 80x24), ``term`` (``TERM``,
    default xterm-256color), ``command`` (a shell line run with ``$SHELL -c``; default: the login
    shell of the agent's user).

    From the client: binary frames are input (at most 64 KiB each); text frames are JSON:
    ``{"type": "resize", "cols", "rows"}``, ``{"type": "input", "data": "text"}``,
    ``{"type": "close"}`` (hang up). To the client: ``{"type": "opened", "session", "pid",
    "argv", "agent"}``, then the terminal's output as binary frames, then ``{"type": "exit",
    "exit_code", "signal", "error", "duration_s"}`` and a normal close (1000). ``exit_code`` is
    null when the terminal did not start or its agent went away (``error`` says which).
    Refusals send ``{"type": "error", "error", "code"}`` and close with ``code``: 4400 (a bad
    parameter), 4401 (not authenticated), 4403 (no permission), 4404 (no such agent), 4503 (the
    agent is not connected or did not start the terminal). Refusals and terminals are events
    on the agent record (``TerminalRefused``, ``TerminalOpened``, ``TerminalClosed``).
    """

    access_rule = ("open_terminal", "agents")  # read by tests/access

    async def connect(self) -> None:
        self.pty_session = uuid.uuid4().hex
        self.gateway: str | None = None
        self.record_id: Any = None
        self.opened = asyncio.Event()
        self.ended = False
        self.exited = False  # the agent reported the program's exit: nothing is left to hang up
        self.watchdog: asyncio.Future[None] | None = None
        # Accept first: a close before accepting is an HTTP 403 for the client, without our code.
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self._refuse(CLOSE_UNAUTHENTICATED, "not authenticated: log in, or send 'Authorization: Token <key>'")
            return
        try:
            params = _terminal_params(self.scope.get("query_string", b""))
            record, self.gateway = await on_db_thread(_terminal_target)(
                user, str(self.scope["url_route"]["kwargs"]["agent_id"])
            )
        except TerminalRefused as exc:
            await self._refuse(exc.code, exc.detail)
            return
        self.record_id = record.pk
        self.agent_name = record.name
        opened = await self._to_gateway(
            {
                "type": "pty.open",
                "session": self.pty_session,
                "reply_to": self.channel_name,
                "user_id": user.pk,
                "username": user.get_username(),
                **params,
            }
        )
        if not opened:
            await self._refuse(CLOSE_UNAVAILABLE, f"the connection of agent {record.name} does not answer")
            return
        self.watchdog = asyncio.ensure_future(self._watch())

    async def _refuse(self, code: int, detail: str) -> None:
        self.ended = True
        await self.send(text_data=json.dumps({"type": "error", "error": detail, "code": code}))
        await self.close(code=code, reason=detail.encode()[:120].decode(errors="ignore"))

    async def _to_gateway(self, message: dict[str, Any]) -> bool:
        assert self.gateway is not None
        return await channel_send(self.channel_layer, self.gateway, message)

    async def _watch(self) -> None:
        """No answer to the open, or the agent's connection gone without a word (its server died)."""
        try:
            await asyncio.wait_for(self.opened.wait(), OPEN_TIMEOUT_SECONDS)
        except TimeoutError:
            await self._to_gateway({"type": "pty.close", "session": self.pty_session, "by": "timeout"})
            await self._refuse(
                CLOSE_UNAVAILABLE,
                f"agent {self.agent_name} did not start the terminal within {OPEN_TIMEOUT_SECONDS:.0f}s "
                "(an agent older than the terminal feature ignores it; update the agent)",
            )
            return
        while not self.ended:
            await asyncio.sleep(WATCH_SECONDS)
            assert self.gateway is not None
            if not await on_db_thread(selectors.agent_connection_is_current)(
                record_id=self.record_id, channel_name=self.gateway
            ):
                await self._end({"exit_code": None, "signal": None, "error": "the agent disconnected"})
                return

    async def disconnect(self, code: int) -> None:
        if self.watchdog is not None:
            self.watchdog.cancel()
        self.ended = True
        # Hang up unless the program is known to have exited: a terminal this side ended for a
        # reason of its own (the agent looked gone, its connection did not keep up) may still
        # run on the machine, and a close for a session the gateway no longer has is ignored.
        if self.gateway is not None and not self.exited:
            try:  # hang up: the gateway records the end when the agent reports the exit
                await self._to_gateway({"type": "pty.close", "session": self.pty_session, "by": "user"})
            except Exception:  # the gateway's own end closes the terminal if this is lost
                logger.warning("could not ask agent %s to close terminal %s", self.record_id, self.pty_session)

    # --- from the user ----------------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.gateway is None or self.ended:
            return
        if bytes_data is not None:
            await self._input(bytes_data)
            return
        try:
            message = json.loads(text_data or "")
            kind = message.get("type") if isinstance(message, dict) else None
        except ValueError:
            kind = None
        if kind == "input":
            await self._input(str(message.get("data", "")).encode())
        elif kind == "resize":
            try:
                cols = max(1, min(1000, int(message["cols"])))
                rows = max(1, min(1000, int(message["rows"])))
            except (KeyError, TypeError, ValueError):
                await self._error("a resize needs whole numbers cols and rows")
                return
            await self._to_gateway({"type": "pty.resize", "session": self.pty_session, "cols": cols, "rows": rows})
        elif kind == "close":
            await self._to_gateway({"type": "pty.close", "session": self.pty_session, "by": "user"})
        else:
            await self._error('text frames are JSON: {"type": "resize"|"input"|"close", ...}; input may be binary')

    async def _input(self, data: bytes) -> None:
        if len(data) > MAX_INPUT_FRAME:
            await self._error(f"an input frame holds at most {MAX_INPUT_FRAME} bytes; this one was dropped")
            return
        if data and not await self._to_gateway(
            {"type": "pty.input", "session": self.pty_session, "data": base64.b64encode(data).decode("ascii")}
        ):
            await self._end({"exit_code": None, "signal": None, "error": "the agent's connection does not keep up"})

    async def _error(self, detail: str) -> None:
        await self.send(text_data=json.dumps({"type": "error", "error": detail}))

    # --- from the agent (through its gateway) ---------------------------------------------------

    async def pty_opened(self, event: dict[str, Any]) -> None:
        self.opened.set()
        await self.send(
            text_data=json.dumps(
                {
                    "type": "opened",
                    "session": self.pty_session,
                    "pid": event["pid"],
                    "argv": event.get("argv", []),
                    "agent": str(self.record_id),
                }
            )
        )

    async def pty_output(self, event: dict[str, Any]) -> None:
        try:
            data = base64.b64decode(event["data"], validate=True)
        except (binascii.Error, ValueError):
            logger.warning("terminal %s: output that is not base64 from agent %s", self.pty_session, self.record_id)
            return
        await self.send(bytes_data=data)
        # Delivered: the agent may read more (it keeps at most PTY_WINDOW chunks in flight).
        await self._to_gateway({"type": "pty.ack", "session": self.pty_session, "seq": event["seq"]})

    async def pty_exit(self, event: dict[str, Any]) -> None:
        self.exited = True
        await self._end(event)

    async def _end(self, event: dict[str, Any]) -> None:
        if self.ended:
            return
        self.ended = True
        self.opened.set()
        if self.watchdog is not None and self.watchdog is not asyncio.current_task():
            self.watchdog.cancel()
        await self.send(
            text_data=json.dumps(
                {
                    "type": "exit",
                    "exit_code": event.get("exit_code"),
                    "signal": event.get("signal"),
                    "error": event.get("error") or "",
                    "duration_s": event.get("duration_s"),
                }
            )
        )
        await self.close(code=1000)
