"""The agent gateway: the websocket every agent dials (``/agents/connect``).

The consumer only authenticates, relays and calls services: every decision and write is in
``apps.agents.services``. Per connection it holds the agent's id and the session id that
fences its writes. It joins the group ``agent.<id>``, whose messages are hints ("there are
commands", "close"); it then reads the command rows, which are the truth. It also re-reads
them on every heartbeat, so a lost hint delays a command by one heartbeat, never loses it.

Terminals (``ws/agents/<id>/pty/``, ``AgentTerminalConsumer``) are relayed, not stored: the
user's consumer sends ``pty.*`` messages straight to the channel of the agent's current
connection (``Agent.channel_name``), which forwards them to the agent and sends the agent's
``pty_*`` answers back to the user's channel. The gateway writes the ``TerminalOpened`` and
``TerminalClosed`` events (it sees every end: the program's exit, or the agent going away).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
import uuid
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.exceptions import ChannelFull
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from graphene_agent import protocol

from apps.agents import selectors, services
from apps.core.errors import NotFound

logger = logging.getLogger(__name__)

AUTH_TIMEOUT_SECONDS = 10.0


class ProtocolError(Exception):
    """The agent sent something the protocol does not allow."""


class AgentGatewayConsumer(AsyncWebsocketConsumer):  # type: ignore[misc,unused-ignore]  # channels is untyped
    record_id: uuid.UUID | None = None
    session: uuid.UUID | None = None

    async def connect(self) -> None:
        self.record_id = None
        self.session = None
        self.group: str | None = None
        self.cancels_sent: set[str] = set()
        self.deliver_lock = asyncio.Lock()
        self.ptys: dict[str, dict[str, Any]] = {}  # terminal session -> its user and start
        await self.accept()
        self.auth_timer = asyncio.ensure_future(self._auth_timeout())

    async def _auth_timeout(self) -> None:
        await asyncio.sleep(AUTH_TIMEOUT_SECONDS)
        if self.record_id is None:
            await self.close(code=protocol.CLOSE_AUTH_TIMEOUT, reason="no auth message in time")

    def _peer(self) -> str:
        client = self.scope.get("client")
        return f"{client[0]}:{client[1]}" if client else ""

    async def disconnect(self, code: int) -> None:
        self.auth_timer.cancel()
        try:
            await self._ptys_lost()
        except Exception:  # the users' consumers notice by themselves (their watchdog)
            logger.exception("could not end the terminals of agent %s", self.record_id)
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self.record_id is not None and self.session is not None:
            try:
                await database_sync_to_async(services.agent_disconnect)(record_id=self.record_id, session=self.session)
            except Exception:  # the heartbeat sweep ends the connection's record later
                logger.exception("could not record the disconnect of agent %s", self.record_id)

    async def send_json(self, message: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(message))

    async def refuse(self, code: int, reason: str) -> None:
        await self.send_json({"type": "refused", "reason": reason})
        await self.close(code=code, reason=reason[:120])

    # --- from the agent -----------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            if text_data is None:
                raise ProtocolError("binary messages are not part of the protocol")
            try:
                message = json.loads(text_data)
            except ValueError:
                raise ProtocolError("a message is not JSON") from None
            if not isinstance(message, dict):
                raise ProtocolError("a message must be a JSON object")
            await self._handle(message)
        except ProtocolError as exc:
            logger.warning("agent %s from %s: protocol error: %s", self.record_id, self._peer(), exc)
            await self.refuse(protocol.CLOSE_PROTOCOL, str(exc))
        except services.AgentRefused as exc:
            await self.refuse(exc.close_code, exc.detail)
        except (KeyError, TypeError, ValueError) as exc:
            await self.refuse(protocol.CLOSE_PROTOCOL, f"malformed {text_data[:40] if text_data else ''!r}: {exc}")

    async def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if self.record_id is None:
            if kind not in ("auth", "bootstrap"):
                raise ProtocolError(f"expected auth or bootstrap first, got {kind!r}")
            await self._authenticate(message, bootstrap=kind == "bootstrap")
            return
        if self.session is None:
            if kind != "hello":
                raise ProtocolError(f"expected hello after the welcome, got {kind!r}")
            await self._hello(message)
            return
        if kind == "heartbeat":
            if not await database_sync_to_async(services.agent_heartbeat)(
                record_id=self.record_id, session=self.session
            ):
                await self.close(code=protocol.CLOSE_SUPERSEDED, reason="superseded by a newer connection")
                return
            await self._deliver(everything=False)
        elif kind == "accepted":
            await database_sync_to_async(services.command_accepted)(record_id=self.record_id, command_id=message["id"])
        elif kind == "output":
            seq = await database_sync_to_async(services.command_output)(
                record_id=self.record_id,
                command_id=str(message["id"]),
                seq=int(message["seq"]),
                stream=str(message.get("stream", "stdout")),
                data=str(message.get("data", "")),
            )
            await self.send_json({"type": "ack", "id": message["id"], "seq": seq})
        elif kind == "result":
            await database_sync_to_async(services.command_finish)(
                record_id=self.record_id, command_id=str(message["id"]), result=message
            )
            self.cancels_sent.discard(str(message["id"]))
            await self.send_json({"type": "ack", "id": message["id"], "result": True})
            await self._deliver(everything=False)  # a command held back behind this one may go now
        elif kind in ("pty_opened", "pty_output", "pty_exit"):
            await self._pty_from_agent(kind, message)
        else:
            raise ProtocolError(f"unknown message type {kind!r}")

    async def _authenticate(self, message: dict[str, Any], *, bootstrap: bool) -> None:
        outcome = await database_sync_to_async(services.agent_authenticate)(
            agent_id=str(message.get("agent_id", "")),
            credential=None if bootstrap else str(message.get("credential") or ""),
            bootstrap_token=str(message.get("token") or "") if bootstrap else None,
            peer=self._peer(),
        )
        self.record_id = outcome.record_id
        self.auth_timer.cancel()
        welcome: dict[str, Any] = {
            "type": "welcome",
            "agent_id": str(outcome.record_id),
            "heartbeat_s": settings.GRAPHENE_AGENT_HEARTBEAT_SECONDS,
        }
        if outcome.credential is not None:
            welcome["credential"] = outcome.credential
        await self.send_json(welcome)

    async def _hello(self, message: dict[str, Any]) -> None:
        assert self.record_id is not None
        facts = message.get("facts")
        if not isinstance(facts, dict):
            raise ProtocolError("the hello must carry a facts object")
        session = uuid.uuid4()
        previous = await database_sync_to_async(services.agent_connect)(
            record_id=self.record_id,
            session=session,
            channel_name=self.channel_name,
            instance=str(message.get("instance", "")),
            version=str(message.get("version", "")),
            facts=facts,
            peer=self._peer(),
        )
        self.session = session
        if previous and previous != self.channel_name:
            await self.channel_layer.send(previous, {"type": "agent.superseded"})
        self.group = services.agent_group(self.record_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self._deliver(everything=True)

    async def _deliver(self, *, everything: bool) -> None:
        assert self.record_id is not None
        assert self.session is not None
        async with self.deliver_lock:
            messages = await database_sync_to_async(services.commands_deliver)(
                record_id=self.record_id, session=self.session, everything=everything
            )
            for message in messages:
                if message["type"] == "cancel":
                    if message["id"] in self.cancels_sent and not everything:
                        continue  # already asked on this connection; the agent is killing it
                    self.cancels_sent.add(message["id"])
                await self.send_json(message)

    # --- from the server (channel layer) ------------------------------------------------------

    async def graphene_notify(self, event: dict[str, Any]) -> None:
        if self.session is None:
            return
        if event.get("event") == "agent.close":
            await self.refuse(int(event.get("code") or protocol.CLOSE_REFUSED), str(event.get("reason", "")))
            return
        await self._deliver(everything=False)

    async def agent_superseded(self, event: dict[str, Any]) -> None:
        await self.close(code=protocol.CLOSE_SUPERSEDED, reason="superseded by a newer connection")

    # --- terminals: relayed between a user's consumer and the agent -----------------------------

    async def pty_open(self, event: dict[str, Any]) -> None:
        session, reply_to = str(event["session"]), str(event["reply_to"])
        if self.session is None or self.record_id is None:
            await _channel_send(
                self.channel_layer,
                reply_to,
                {
                    "type": "pty.exit",
                    "session": session,
                    "exit_code": None,
                    "signal": None,
                    "error": "the agent is not connected",
                },
            )
            return
        self.ptys[session] = {
            "reply_to": reply_to,
            "user_id": event.get("user_id"),
            "username": str(event.get("username", "")),
            "cols": int(event["cols"]),
            "rows": int(event["rows"]),
            "started": time.monotonic(),
            "answered": False,
            "closed_by": "",
        }
        message: dict[str, Any] = {"type": "pty_open", "session": session, "cols": event["cols"], "rows": event["rows"]}
        for key in ("command", "env"):
            if event.get(key):
                message[key] = event[key]
        await self.send_json(message)

    async def pty_input(self, event: dict[str, Any]) -> None:
        if str(event["session"]) in self.ptys:
            await self.send_json({"type": "pty_input", "session": event["session"], "data": event["data"]})

    async def pty_resize(self, event: dict[str, Any]) -> None:
        if str(event["session"]) in self.ptys:
            await self.send_json(
                {"type": "pty_resize", "session": event["session"], "cols": event["cols"], "rows": event["rows"]}
            )

    async def pty_ack(self, event: dict[str, Any]) -> None:
        if str(event["session"]) in self.ptys:
            await self.send_json({"type": "pty_ack", "session": event["session"], "seq": event["seq"]})

    async def pty_close(self, event: dict[str, Any]) -> None:
        pty = self.ptys.get(str(event["session"]))
        if pty is not None:
            pty["closed_by"] = str(event.get("by") or "user")
            await self.send_json({"type": "pty_close", "session": event["session"]})

    async def _pty_from_agent(self, kind: str, message: dict[str, Any]) -> None:
        session = str(message.get("session", ""))
        pty = self.ptys.get(session)
        if pty is None:
            if kind != "pty_exit":  # nobody is at the other end (the user left first): hang it up
                await self.send_json({"type": "pty_close", "session": session})
            return
        if kind == "pty_output":
            relayed = {
                "type": "pty.output",
                "session": session,
                "seq": int(message["seq"]),
                "data": str(message["data"]),
            }
            if not await _channel_send(self.channel_layer, pty["reply_to"], relayed):
                pty["closed_by"] = "gateway"  # the user's consumer is gone or stuck
                await self.send_json({"type": "pty_close", "session": session})
            return
        if kind == "pty_opened":
            pty["answered"] = True
            pty["started"] = time.monotonic()
            argv = [str(a) for a in message.get("argv") or []]
            try:
                await database_sync_to_async(services.terminal_opened)(
                    record_id=self.record_id,
                    session=session,
                    user_id=pty["user_id"],
                    username=pty["username"],
                    pid=int(message["pid"]),
                    argv=argv,
                    cols=pty["cols"],
                    rows=pty["rows"],
                )
            except Exception:  # no trail, no terminal
                logger.exception("could not record the terminal %s on agent %s; closing it", session, self.record_id)
                pty["closed_by"] = "gateway"
                await self.send_json({"type": "pty_close", "session": session})
                return
            await _channel_send(
                self.channel_layer,
                pty["reply_to"],
                {"type": "pty.opened", "session": session, "pid": int(message["pid"]), "argv": argv},
            )
            return
        # pty_exit: the last message of a session
        del self.ptys[session]
        await self._pty_ended(
            session,
            pty,
            exit_code=message.get("exit_code"),
            signal=message.get("signal"),
            error=str(message.get("error") or ""),
        )

    async def _pty_ended(
        self, session: str, pty: dict[str, Any], *, exit_code: Any, signal: Any, error: str, record: bool = True
    ) -> None:
        duration = time.monotonic() - pty["started"]
        exit_code = int(exit_code) if exit_code is not None else None
        signal = int(signal) if signal is not None else None
        if record:
            try:
                await database_sync_to_async(services.terminal_closed)(
                    record_id=self.record_id,
                    session=session,
                    user_id=pty["user_id"],
                    username=pty["username"],
                    exit_code=exit_code,
                    signal=signal,
                    duration_s=duration,
                    error=error,
                    closed_by=pty["closed_by"],
                )
            except Exception:
                logger.exception("could not record the end of terminal %s on agent %s", session, self.record_id)
        await _channel_send(
            self.channel_layer,
            pty["reply_to"],
            {
                "type": "pty.exit",
                "session": session,
                "exit_code": exit_code,
                "signal": signal,
                "error": error,
                "duration_s": round(duration, 3),
            },
        )

    async def _ptys_lost(self) -> None:
        """The agent's connection ended: its terminals ended with it (the agent hangs them up)."""
        ptys, self.ptys = self.ptys, {}
        for session, pty in ptys.items():
            # Only a terminal the agent answered has a TerminalOpened event to close.
            await self._pty_ended(
                session, pty, exit_code=None, signal=None, error="the agent disconnected", record=pty["answered"]
            )


async def _channel_send(layer: Any, channel: str, message: dict[str, Any], *, patience: float = 5.0) -> bool:
    """Send on the channel layer, waiting up to ``patience`` seconds while the channel is full.

    Terminal traffic is bounded at its source (the agent's output window, the user's frame size),
    so a full channel means a stuck or vanished consumer; ``False`` tells the caller to end it.
    """
    deadline = time.monotonic() + patience
    while True:
        try:
            await layer.send(channel, message)
            return True
        except ChannelFull:
            if time.monotonic() > deadline:
                logger.warning("channel %s stayed full for %.0fs; giving up on it", channel, patience)
                return False
            await asyncio.sleep(0.05)


# --- the user's side of a terminal -------------------------------------------------------------

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
    params = {k: v[-1] for k, v in parse_qs(query_string.decode(errors="replace")).items()}
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
    if not selectors.agent_can_open_terminal(user=user):
        detail = (
            f"{user.get_username()} may not open a terminal on agent {record.name}: "
            f"that needs the {selectors.TERMINAL_PERMISSION} permission"
        )
        services.terminal_refused(record_id=record.pk, user=user, why="permission", message=detail)
        raise TerminalRefused(CLOSE_FORBIDDEN, detail)
    connection = selectors.agent_connection(record=record)
    if connection is None:
        detail = f"agent {record.name} ({record.pk}) is not connected; a terminal needs a connected agent"
        services.terminal_refused(record_id=record.pk, user=user, why="not_connected", message=detail)
        raise TerminalRefused(CLOSE_UNAVAILABLE, detail)
    return record, connection.channel_name


class AgentTerminalConsumer(AsyncWebsocketConsumer):  # type: ignore[misc,unused-ignore]  # channels is untyped
    """``ws/agents/<id>/pty/``: a terminal on the agent's machine, for a user with ``agents.open_terminal``.

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

    async def connect(self) -> None:
        self.pty_session = uuid.uuid4().hex
        self.gateway: str | None = None
        self.record_id: Any = None
        self.opened = asyncio.Event()
        self.ended = False
        self.watchdog: asyncio.Future[None] | None = None
        # Accept first: a close before accepting is an HTTP 403 for the client, without our code.
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self._refuse(CLOSE_UNAUTHENTICATED, "not authenticated: log in, or send 'Authorization: Token <key>'")
            return
        try:
            params = _terminal_params(self.scope.get("query_string", b""))
            record, self.gateway = await database_sync_to_async(_terminal_target)(
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
        return await _channel_send(self.channel_layer, self.gateway, message)

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
            if not await database_sync_to_async(selectors.agent_connection_is_current)(
                record_id=self.record_id, channel_name=self.gateway
            ):
                await self._end({"exit_code": None, "signal": None, "error": "the agent disconnected"})
                return

    async def disconnect(self, code: int) -> None:
        if self.watchdog is not None:
            self.watchdog.cancel()
        if self.gateway is not None and not self.ended:
            self.ended = True
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
