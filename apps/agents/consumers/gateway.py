"""The agent gateway: the websocket every agent dials (``/agents/connect``).

The consumer only authenticates, relays and calls services: every decision and write is in
``apps.agents.services``. Per connection it holds the agent's id and the session id that
fences its writes. It joins the group ``agent.<id>``, whose messages are hints ("there are
commands", "close"); it then reads the command rows, which are the truth. It also re-reads
them on every heartbeat, so a lost hint delays a command by one heartbeat, never loses it.

It relays live calls (``apps.agents.live``): a worker's ``agent.live_call`` goes to the agent
as ``live_call`` and its ``live_result`` back to the worker's reply channel; nothing is
stored. A connection that ends answers its calls still under way with ``lost``.

It also relays terminals for ``consumers.terminal``: ``pty.*`` messages from a user's consumer
go to the agent, the agent's ``pty_*`` answers go back to the user's channel, and the gateway
writes the ``TerminalOpened`` and ``TerminalClosed`` events (it sees every end: the program's
exit, or the agent going away).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

from channels.exceptions import ChannelFull
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.utils import timezone
from graphene_agent import protocol

from apps.agents import live, services
from apps.core import audit, validation
from apps.core.db import on_db_thread
from apps.core.errors import GrapheneError, ValidationFailed

logger = logging.getLogger(__name__)

AUTH_TIMEOUT_SECONDS = 10.0

T = TypeVar("T")


class ProtocolError(Exception):
    """The agent sent something the protocol does not allow."""


class AgentGatewayConsumer(AsyncWebsocketConsumer):  # type: ignore[misc,unused-ignore]  # channels is untyped
    record_id: uuid.UUID | None = None
    session: uuid.UUID | None = None
    # Agents are actors of their own: each authenticates with its credential (or a single-use
    # bootstrap token) in its first message and acts only as itself, on its own commands.
    access_rule = "agent-credential"

    async def connect(self) -> None:
        self.record_id = None
        self.who: audit.Who | None = None
        self.session = None
        self.group: str | None = None
        self.cancels_sent: set[str] = set()
        self.deliver_lock = asyncio.Lock()
        self.ptys: dict[str, dict[str, Any]] = {}  # terminal session -> its user and start
        self.features: frozenset[str] = frozenset()  # what the agent's hello offers
        self.live_calls: dict[str, str] = {}  # live call id -> the worker's reply channel
        self.expiry_timer: asyncio.Future[None] | None = None
        await self.accept()
        self.auth_timer = asyncio.ensure_future(self._auth_timeout())

    async def _auth_timeout(self) -> None:
        await asyncio.sleep(AUTH_TIMEOUT_SECONDS)
        if self.record_id is None:
            await self.close(code=protocol.CLOSE_AUTH_TIMEOUT, reason="no auth message in time")

    async def _expire_at(self, expires_at: datetime) -> None:
        """Close the connection when its credential expires, as the next connect would be refused."""
        await asyncio.sleep(max(0.0, (expires_at - timezone.now()).total_seconds()))
        assert self.record_id is not None
        reason = await on_db_thread(services.agent_credential_expired)(record_id=self.record_id, expires_at=expires_at)
        await self.refuse(protocol.CLOSE_REFUSED, reason)

    def _peer(self) -> str:
        client = self.scope.get("client")
        return f"{client[0]}:{client[1]}" if client else ""

    async def disconnect(self, code: int) -> None:
        self.auth_timer.cancel()
        if self.expiry_timer is not None:
            self.expiry_timer.cancel()
        try:
            await self._ptys_lost()
        except Exception:  # the users' consumers notice by themselves (their watchdog)
            logger.exception("could not end the terminals of agent %s", self.record_id)
        calls, self.live_calls = self.live_calls, {}
        for call_id, reply_to in calls.items():
            await channel_send(self.channel_layer, reply_to, live.lost_reply(call_id, "the agent's connection ended"))
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self.record_id is not None and self.session is not None:
            try:
                await self._as_agent(services.agent_disconnect)(record_id=self.record_id, session=self.session)
            except Exception:  # the heartbeat sweep ends the connection's record later
                logger.exception("could not record the disconnect of agent %s", self.record_id)

    def _as_agent(self, fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
        """``fn`` on a database thread, in the audit context of this connection's agent: what
        the agent reports is written by the agent (a user's terminal names its user)."""
        who = self.who

        def call(**kwargs: Any) -> T:
            with audit.acting(who):
                return fn(**kwargs)

        return on_db_thread(call)

    async def send_json(self, message: dict[str, Any]) -> None:
        text = json.dumps(message)
        try:
            await self.send(text_data=text)
        except Exception as exc:  # the server's "closed protocol" error (daphne: autobahn's Disconnected)
            # The agent went away while this connection handled one of its messages: nothing
            # can reach it any more, and this handler must not die of it, or the disconnect that
            # follows (which records the agent's going and answers its live calls) never runs.
            logger.info("agent %s: a message to a closed connection was dropped (%s)", self.record_id, exc)

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
            if not await self._as_agent(services.agent_heartbeat)(record_id=self.record_id, session=self.session):
                await self.close(code=protocol.CLOSE_SUPERSEDED, reason="superseded by a newer connection")
                return
            await self._deliver(everything=False)
        elif kind == "accepted":
            await self._as_agent(services.command_accepted)(record_id=self.record_id, command_id=message["id"])
        elif kind == "output":
            seq = await self._as_agent(services.command_output)(
                record_id=self.record_id,
                command_id=str(message["id"]),
                seq=int(message["seq"]),
                stream=str(message.get("stream", "stdout")),
                data=str(message.get("data", "")),
            )
            await self.send_json({"type": "ack", "id": message["id"], "seq": seq})
        elif kind == "result":
            await self._as_agent(services.command_finish)(
                record_id=self.record_id, command_id=str(message["id"]), result=message
            )
            self.cancels_sent.discard(str(message["id"]))
            await self.send_json({"type": "ack", "id": message["id"], "result": True})
            await self._deliver(everything=False)  # a command held back behind this one may go now
        elif kind == "live_result":
            reply_to = self.live_calls.pop(str(message["id"]), None)
            if reply_to is not None:  # else: the call was not sent on this connection
                await channel_send(self.channel_layer, reply_to, live.result_reply(message))
        elif kind in ("pty_opened", "pty_output", "pty_exit"):
            await self._pty_from_agent(kind, message)
        else:
            raise ProtocolError(f"unknown message type {kind!r}")

    async def _authenticate(self, message: dict[str, Any], *, bootstrap: bool) -> None:
        outcome = await on_db_thread(services.agent_authenticate)(
            agent_id=str(message.get("agent_id", "")),
            credential=None if bootstrap else str(message.get("credential") or ""),
            bootstrap_token=str(message.get("token") or "") if bootstrap else None,
            peer=self._peer(),
        )
        self.record_id = outcome.record_id
        self.who = audit.who_agent(outcome.record_id, outcome.name)
        self.auth_timer.cancel()
        if outcome.expires_at is not None:
            self.expiry_timer = asyncio.ensure_future(self._expire_at(outcome.expires_at))
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
        # What the hello carries is stored: refused, by path, if PostgreSQL cannot store it.
        try:
            validation.check_json(
                {"facts": facts, "instance": message.get("instance", ""), "version": message.get("version", "")},
                what="the hello",
            )
        except ValidationFailed as exc:
            raise ProtocolError(exc.detail) from None
        features = message.get("features") or []
        if not isinstance(features, list):
            raise ProtocolError("the hello's features must be a list")
        self.features = frozenset(str(f) for f in features)
        session = uuid.uuid4()
        previous = await self._as_agent(services.agent_connect)(
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
            messages = await self._as_agent(services.commands_deliver)(
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

    async def agent_live_call(self, event: dict[str, Any]) -> None:
        """A worker's live call: to the agent, if this is still the connection it was meant for
        and the agent serves live calls (else the worker sends it as a command instead)."""
        call_id, reply_to = str(event["id"]), str(event["reply_to"])
        if self.session is None or str(self.session) != str(event.get("session")):
            await channel_send(self.channel_layer, reply_to, live.lost_reply(call_id, "the agent's connection changed"))
            return
        if protocol.LIVE_CALL not in self.features:
            await channel_send(self.channel_layer, reply_to, live.unsupported_reply(call_id))
            return
        try:
            payload = live.opened(event)
        except GrapheneError as exc:
            await channel_send(self.channel_layer, reply_to, live.lost_reply(call_id, exc.detail))
            return
        self.live_calls[call_id] = reply_to
        await self.send_json({"type": protocol.LIVE_CALL, "id": call_id, "payload": payload})

    async def agent_superseded(self, event: dict[str, Any]) -> None:
        await self.close(code=protocol.CLOSE_SUPERSEDED, reason="superseded by a newer connection")

    # --- terminals: relayed between a user's consumer and the agent -----------------------------

    async def pty_open(self, event: dict[str, Any]) -> None:
        session, reply_to = str(event["session"]), str(event["reply_to"])
        if self.session is None or self.record_id is None:
            await channel_send(
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
            if not await channel_send(self.channel_layer, pty["reply_to"], relayed):
                pty["closed_by"] = "gateway"  # the user's consumer is gone or stuck
                await self.send_json({"type": "pty_close", "session": session})
            return
        if kind == "pty_opened":
            pty["answered"] = True
            pty["started"] = time.monotonic()
            argv = [str(a) for a in message.get("argv") or []]
            try:
                await self._as_agent(services.terminal_opened)(
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
            await channel_send(
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
                await self._as_agent(services.terminal_closed)(
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
        await channel_send(
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


async def channel_send(layer: Any, channel: str, message: dict[str, Any], *, patience: float = 5.0) -> bool:
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
