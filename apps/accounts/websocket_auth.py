"""Token authentication for websockets, as the REST API does it: ``Authorization: Token <key>``
(or ``Bearer <key>``), looked up by ``services.access_token_authenticate``.

Browsers cannot set headers on a websocket and use the session cookie (Channels'
``AuthMiddlewareStack``, which runs first); other clients (graphenectl) send a token. Tokens
never go in the URL (URLs are logged).

A refused token (unknown, expired, revoked, its account deleted, its user inactive) never
reaches a consumer: the socket is accepted, told why in one JSON message
``{"type": "error", "error": detail, "code": 4401, "reason": code}`` and closed with 4401.

A connection a token opened is watched for as long as it lasts, whatever consumer serves it:
it closes with 4401 (after the same kind of message) when the token is revoked (a message on
the channel group ``token.<id>``, sent by the revoking service), when it expires (a timer),
and, should a message be lost, at the next look at the token's row (every
``RECHECK_SECONDS``). The consumer is told ``websocket.disconnect`` and cleans up as when a
client goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from channels.auth import AuthMiddleware, get_user
from channels.layers import get_channel_layer
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.utils import timezone

from apps.accounts import services
from apps.accounts.authentication import presented_key
from apps.core.db import on_db_thread

logger = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
# How often an open connection's token is looked at again: the revocation message is a hint;
# the row is the truth. This is also how often its group membership is renewed (a channel
# layer forgets members after a day).
RECHECK_SECONDS = 60.0


def _key(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            return presented_key(value.decode("latin-1"))
    return None


def _authenticate(key: str) -> Any:
    if not key or " " in key:
        raise services.TokenRefused("the Authorization header must be 'Token <key>' or 'Bearer <key>'")
    return services.access_token_authenticate(key=key)


def _error(detail: str, reason: str) -> dict[str, Any]:
    text = json.dumps({"type": "error", "error": detail, "code": CLOSE_UNAUTHENTICATED, "reason": reason})
    return {"type": "websocket.send", "text": text}


async def _refuse(receive: Any, send: Any, refusal: services.TokenRefused) -> None:
    """Accept, say why, close with 4401: a close before accepting reaches the client as a bare
    HTTP 403, without the reason."""
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    await send(_error(refusal.detail, refusal.code))
    await send({"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED})
    while (await receive())["type"] != "websocket.disconnect":
        pass


class _SessionAuthMiddleware(AuthMiddleware):
    """Channels' ``AuthMiddleware`` with the session's user looked up ``on_db_thread``."""

    async def resolve_scope(self, scope: dict[str, Any]) -> None:
        scope["user"]._wrapped = await on_db_thread(get_user.func)(scope)


def SessionAuthMiddlewareStack(inner: Any) -> Any:
    """Channels' ``AuthMiddlewareStack`` (the session cookie: the Studio), whose user lookup
    does not wait behind every other socket's database calls on Channels' one shared thread."""
    return CookieMiddleware(SessionMiddleware(_SessionAuthMiddleware(inner)))


class TokenAuthMiddleware:
    """Sets ``scope["user"]`` (and ``scope["access_token_id"]``) from an ``Authorization``
    header, when one is sent; refuses a token that does not authenticate, and closes the
    connection when its token stops authenticating."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope.get("type") != "websocket":
            return await self.app(scope, receive, send)
        key = _key(scope)
        if key is None:
            return await self.app(scope, receive, send)
        try:
            token = await on_db_thread(_authenticate)(key)
        except services.TokenRefused as refusal:
            return await _refuse(receive, send, refusal)
        scope = {**scope, "user": token.user, "access_token_id": str(token.pk)}
        return await _Watched(self.app, scope, receive, send, token).run()


class _Watched:
    """One token-authenticated connection: the consumer, and a watcher that ends it when the
    token stops authenticating."""

    def __init__(self, app: Any, scope: dict[str, Any], receive: Any, send: Any, token: Any) -> None:
        self.app, self.scope, self.receive, self.send = app, scope, receive, send
        self.token_id = token.pk
        self.expires_at = token.expires_at
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.closed = False  # the connection was closed (by the consumer or the watcher)

    async def run(self) -> Any:
        pump = asyncio.ensure_future(self._pump())
        watcher = asyncio.ensure_future(self._watch())
        try:
            return await self.app(self.scope, self.inbox.get, self._send)
        finally:
            for task in (watcher, pump):
                task.cancel()
            for task in (watcher, pump):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _pump(self) -> None:
        """The server's messages, passed on to the consumer as they come."""
        while True:
            message = await self.receive()
            await self.inbox.put(message)
            if message["type"] == "websocket.disconnect":
                return

    async def _send(self, message: dict[str, Any]) -> None:
        if self.closed and message["type"] in ("websocket.send", "websocket.close"):
            return  # the watcher closed it: what the consumer still says goes nowhere
        if message["type"] == "websocket.close":
            self.closed = True
        await self.send(message)

    async def _watch(self) -> None:
        layer = get_channel_layer()
        group = services.token_group(self.token_id)
        channel: str | None = None
        try:
            if layer is not None:
                try:
                    channel = await layer.new_channel()
                except Exception:
                    logger.warning("token %s: no channel; watching its row only", self.token_id, exc_info=True)
            refusal = await self._wait(layer, channel, group)
        finally:
            if channel is not None:
                with contextlib.suppress(Exception):
                    await layer.group_discard(group, channel)
        if refusal is not None and not self.closed:
            logger.info("closing a websocket of token %s: %s", self.token_id, refusal.detail)
            self.closed = True
            with contextlib.suppress(Exception):  # the client may be gone already
                await self.send(_error(refusal.detail, refusal.code))
                await self.send({"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED})
            await self.inbox.put({"type": "websocket.disconnect", "code": CLOSE_UNAUTHENTICATED})

    async def _wait(self, layer: Any, channel: str | None, group: str) -> services.TokenRefused:
        """Until the token stops authenticating (this task is cancelled when the connection
        ends first): why. Without a working channel layer, the row alone is watched."""
        recheck = on_db_thread(services.access_token_recheck)
        while True:
            if channel is not None:
                try:
                    await layer.group_add(group, channel)
                except Exception:
                    logger.warning(
                        "token %s: cannot join %s; watching its row only", self.token_id, group, exc_info=True
                    )
                    channel = None
            # Looked at after joining the group: a revocation committed between the
            # authentication and the join has sent its message to no one.
            refusal = await recheck(token_id=self.token_id)
            if refusal is not None:
                return refusal
            left = (self.expires_at - timezone.now()).total_seconds()
            wait = max(0.0, min(RECHECK_SECONDS, left))
            if channel is None:
                await asyncio.sleep(wait)
                continue
            try:
                await asyncio.wait_for(layer.receive(channel), timeout=wait)
            except TimeoutError:
                pass  # look at the row again: expired now, or revoked while a message was lost
            except Exception:
                logger.warning(
                    "token %s: the channel layer failed; watching its row only", self.token_id, exc_info=True
                )
                channel = None
            # A message (token.revoked) or not: the row says whether the token still authenticates.
