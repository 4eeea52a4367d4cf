"""Token authentication for websockets, as the REST API does it: ``Authorization: Token <key>``.

Browsers cannot set headers on a websocket and use the session cookie (Channels'
``AuthMiddlewareStack``, which runs first); other clients (graphenectl) send the token. A
token that is unknown, or whose user is inactive, makes the user anonymous: the consumer then
refuses with 4401, as it would without credentials. Tokens never go in the URL (URLs are logged).
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from django.contrib.auth.models import AnonymousUser
from rest_framework.authtoken.models import Token


def _token(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            scheme, _, key = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "token" and key.strip():
                return key.strip()
    return None


def _user_for(key: str) -> Any:
    token = Token.objects.select_related("user").filter(key=key).first()
    if token is None or not token.user.is_active:
        return AnonymousUser()
    return token.user


class TokenAuthMiddleware:
    """Sets ``scope["user"]`` from an ``Authorization: Token`` header, when one is sent."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        key = _token(scope)
        if key is not None:
            scope = {**scope, "user": await database_sync_to_async(_user_for)(key)}
        return await self.app(scope, receive, send)
