"""The agent gateway: the websocket every agent dials (``/agents/connect``).

The consumer only authenticates, relays and calls services: every decision and write is in
``apps.agents.services``. Per connection it holds the agent's id and the session id that
fences its writes. It joins the group ``agent.<id>``, whose messages are hints ("there are
commands", "close"); it then reads the command rows, which are the truth. It also re-reads
them on every heartbeat, so a lost hint delays a command by one heartbeat, never loses it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from graphene_agent import protocol

from apps.agents import services

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
