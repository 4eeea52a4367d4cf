"""Live calls: a function of the server's own called on an agent's machine over the agent's
connection, with no row: how ``AgentMachines.request`` sends what a worker waits for in place.

A ``call`` command is a row: stored, delivered, accepted, finished, taken — five transactions
and two hops through the channel layer around every call. That is what a durable operation
needs (``run``: its worker may be gone when the command ends). A call waited for in place
(``kinds.machine``'s ``request``, the docker kinds' engine requests, a dozen or more per
container create) has its waiter right there and is cancelled when the agent leaves, so the
row bought it nothing but time. A live call goes the way a terminal's bytes go:

    worker --channel layer--> the gateway consumer of the agent's current connection
           --websocket--> agent (the function in a thread) --websocket--> gateway
           --channel layer--> the worker's reply channel

The worker sends ``agent.live_call`` to ``Agent.channel_name`` with the connection's
``session`` (a connection that is no longer the agent's current one answers ``lost``) and its
reply channel; the gateway sends ``live_call`` to the agent (``graphene_agent.protocol``),
which answers ``live_result``; the gateway puts it on the reply channel. Nothing is stored,
journaled or re-sent: a connection that ends with calls under way answers them ``lost``, and
the operation stops as ``kinds.machine`` says for an agent that goes away (the kinds' creates
are adopt-or-create by the record's label, so the next try does not make a second object).
An agent whose hello did not offer live calls (one from before them) is answered
``unsupported``, and the call goes as a command after all.

A sealed call (its arguments hold a secret's value, I7) crosses the channel layer encrypted,
as a sealed command is stored, and only the gateway opens it, to send it to the agent.

Live calls need a channel layer that reaches other processes (Redis, as in production). The
in-memory layer (the test settings' and embedded mode's) does not: then ``available()`` is
false and every call is a command.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

logger = logging.getLogger(__name__)

# The channel-layer message type the gateway consumer handles (``agent_live_call``).
CALL_TYPE = "agent.live_call"
REPLY_TYPE = "live.result"
REPLY_PREFIX = "graphene-live"
SEAL_NAMESPACE = "agent-live-call"
# How long handing a call to the channel layer may take (Redis on the same network).
SEND_SECONDS = 10.0
# The result fields relayed from the agent's ``live_result`` (a ``call``'s).
RESULT_KEYS = ("status", "value", "error", "error_type", "error_message", "traceback", "timed_out", "duration_s")


class Unsupported(Exception):
    """The agent's connection does not serve live calls (an agent from before them)."""


def available() -> bool:
    """Whether this process's channel layer reaches the gateway's processes (not in-memory)."""
    backend = str((settings.CHANNEL_LAYERS.get("default") or {}).get("BACKEND") or "")
    return bool(backend) and not backend.endswith("InMemoryChannelLayer")


# --- the gateway's side -------------------------------------------------------------------------


def lost_reply(call_id: str, why: str) -> dict[str, Any]:
    return {"type": REPLY_TYPE, "id": call_id, "lost": why}


def unsupported_reply(call_id: str) -> dict[str, Any]:
    return {"type": REPLY_TYPE, "id": call_id, "unsupported": True}


def result_reply(message: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": REPLY_TYPE,
        "id": str(message["id"]),
        "result": {key: message[key] for key in RESULT_KEYS if key in message},
    }


def opened(event: Mapping[str, Any]) -> dict[str, Any]:
    """The call's payload from a worker's ``agent.live_call`` (decrypted if it was sealed)."""
    if "sealed" not in event:
        return dict(event["payload"])
    from apps.secrets.crypto import decrypt

    payload: dict[str, Any] = json.loads(
        decrypt(namespace=SEAL_NAMESPACE, name=str(event["id"]), ciphertext=str(event["sealed"]))
    )
    return payload


# --- the worker's side --------------------------------------------------------------------------


@dataclass
class Pending:
    """A live call sent; its reply arrives on the process's reply channel."""

    id: str
    future: concurrent.futures.Future[dict[str, Any]]
    relay: _Relay

    def wait(self, seconds: float) -> dict[str, Any] | None:
        """The gateway's reply (``result``, ``lost`` or ``unsupported``), or ``None`` after
        ``seconds``; raises what sending the call raised (the channel layer's store is down)."""
        try:
            return self.future.result(timeout=max(seconds, 0.0))
        except concurrent.futures.TimeoutError:
            return None

    def forget(self) -> None:
        """Given up on: a reply arriving later is dropped."""
        with self.relay.lock:
            self.relay.futures.pop(self.id, None)


class _Relay:
    """A process's own channel layer on an event loop in a thread, and its reply channel."""

    def __init__(self) -> None:
        from channels import DEFAULT_CHANNEL_LAYER
        from channels.layers import channel_layers

        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.futures: dict[str, concurrent.futures.Future[dict[str, Any]]] = {}
        # A layer of its own: the process's shared one may be bound to another event loop (daphne's).
        self.layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
        self.loop = asyncio.new_event_loop()
        ready: concurrent.futures.Future[str] = concurrent.futures.Future()
        threading.Thread(target=self._run, args=(ready,), name="graphene-live-calls", daemon=True).start()
        self.channel = ready.result(timeout=SEND_SECONDS)

    def _run(self, ready: concurrent.futures.Future[str]) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._listen(ready))

    async def _listen(self, ready: concurrent.futures.Future[str]) -> None:
        try:
            channel = await self.layer.new_channel(f"{REPLY_PREFIX}.")
        except Exception as exc:
            ready.set_exception(exc)
            return
        ready.set_result(channel)
        while True:
            try:
                message = await self.layer.receive(channel)
            except Exception:  # the layer's store blinked: the waiters time out or see the agent's state
                logger.warning("live calls: receiving on %s failed; receiving again", channel, exc_info=True)
                await asyncio.sleep(0.5)
                continue
            with self.lock:
                future = self.futures.pop(str(message.get("id")), None)
            if future is not None and not future.done():
                future.set_result(message)

    def start(self, *, channel_name: str, session: Any, payload: dict[str, Any], sealed: bool) -> Pending:
        call_id = uuid.uuid4().hex
        future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        with self.lock:
            self.futures[call_id] = future
        event: dict[str, Any] = {"type": CALL_TYPE, "id": call_id, "reply_to": self.channel, "session": str(session)}
        if sealed:
            from apps.secrets.crypto import encrypt

            event["sealed"], _key = encrypt(namespace=SEAL_NAMESPACE, name=call_id, value=json.dumps(payload))
        else:
            event["payload"] = payload
        pending = Pending(id=call_id, future=future, relay=self)
        # Not waited for here: a send that fails ends the wait for the reply with its error.
        sent = asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(self.layer.send(channel_name, event), SEND_SECONDS), self.loop
        )
        sent.add_done_callback(lambda done: self._send_failed(pending, done))
        return pending

    def _send_failed(self, pending: Pending, sent: concurrent.futures.Future[None]) -> None:
        error = None if sent.cancelled() else sent.exception()
        if error is not None:
            pending.forget()
            if not pending.future.done():
                pending.future.set_exception(error)


_relay: _Relay | None = None
_relay_lock = threading.Lock()


def start(*, channel_name: str, session: Any, payload: dict[str, Any], sealed: bool) -> Pending:
    """Send a live call to the gateway consumer ``channel_name`` of connection ``session``."""
    global _relay
    with _relay_lock:
        if _relay is None or _relay.pid != os.getpid():  # none yet, or inherited by a forked worker
            _relay = _Relay()
        relay = _relay
    return relay.start(channel_name=channel_name, session=session, payload=payload, sealed=sealed)
