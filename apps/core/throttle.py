"""A limit on failed authentications: per client address, and per username at the login form.

Guessing a password or a token takes many failures; using a good one takes none. So only
failures are counted, in Django's cache (Redis in production: shared by every web process;
settings/base.py), in fixed windows of ``WINDOW_SECONDS``. Once an address (or a username)
has failed ``GRAPHENE_AUTH_FAILURES_PER_MINUTE`` times in the current window, its next
attempts are refused without being judged (429 with ``Retry-After``) until the window ends.
A client that authenticates is never counted, never delayed. 0 turns the limit off.

The choke points that call this module:

* the Studio's login form (``StudioSite.login``): the address and the username;
* ``AuthFailureThrottleMiddleware`` (``apps/api/middleware.py``): 401 answers under ``/api/``
  to clients that are not logged in to the Studio;
* ``WebsocketAuthFailureThrottle`` (below, in ``asgi.py``): websockets closed with 4401 (an
  unknown token or agent credential).

An authentication class can use it directly instead (see ``auth_failure_throttled``).

A cache that cannot be reached fails open: the attempt is served and a warning logged (an
outage of Redis must not lock everybody out of the Studio).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import time
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest

from apps.core.db import on_db_thread

logger = logging.getLogger(__name__)

WINDOW_SECONDS = 60
# The websocket close code of a refused connection (the HTTP answer's 429, in the 4000 range).
CLOSE_THROTTLED = 4429
CLOSE_UNAUTHENTICATED = 4401


def _now() -> float:
    return time.time()


def _limit() -> int:
    return int(getattr(settings, "GRAPHENE_AUTH_FAILURES_PER_MINUTE", 10))


# --- who is asking ------------------------------------------------------------------------------


def client_address(*, peer: str | None, forwarded_for: str | None = None) -> str:
    """The address a request comes from: the one place that decides it.

    ``peer`` is the connection's other end (``REMOTE_ADDR``, which daphne sets; a websocket
    scope's ``client``). ``X-Forwarded-For`` (``forwarded_for``) is believed only when the
    peer is one of ``GRAPHENE_TRUSTED_PROXIES`` (addresses or networks; none by default):
    then the address is its right-most entry that is not a trusted proxy. Anybody can send
    the header; only a proxy of ours can be trusted to have written it.
    """
    peer = (peer or "").strip() or "unknown"
    trusted = _trusted_proxies(getattr(settings, "GRAPHENE_TRUSTED_PROXIES", ()))
    if not forwarded_for or not trusted or not _is_in(peer, trusted):
        return peer
    for hop in reversed([part.strip() for part in forwarded_for.split(",") if part.strip()]):
        if not _is_in(hop, trusted):
            return hop
    return peer


def _trusted_proxies(values: Iterable[str] | str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    networks = []
    for value in [values] if isinstance(values, str) else values:
        try:
            networks.append(ipaddress.ip_network(str(value).strip(), strict=False))
        except ValueError:
            logger.warning("GRAPHENE_TRUSTED_PROXIES: %r is not an address or a network; ignored", value)
    return networks


def _is_in(address: str, networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)


def request_client_address(request: HttpRequest) -> str:
    return client_address(peer=request.META.get("REMOTE_ADDR"), forwarded_for=request.META.get("HTTP_X_FORWARDED_FOR"))


def scope_client_address(scope: dict[str, Any]) -> str:
    client = scope.get("client")
    forwarded = None
    for name, value in scope.get("headers", []):
        if name.lower() == b"x-forwarded-for":
            forwarded = value.decode("latin-1")
    return client_address(peer=str(client[0]) if client else None, forwarded_for=forwarded)


# --- counting -----------------------------------------------------------------------------------


def _keys(address: str, username: str | None) -> list[str]:
    """Cache keys of the current window (digests: any text is a valid key, none is stored)."""
    window = int(_now() // WINDOW_SECONDS)
    subjects = [("address", address)]
    if username:
        subjects.append(("username", username.strip().lower()))
    return [
        f"graphene:auth-failures:{kind}:{hashlib.sha256(value.encode()).hexdigest()[:32]}:{window}"
        for kind, value in subjects
    ]


def _retry_after() -> int:
    """Seconds until the current window ends (at least 1)."""
    return max(1, math.ceil(WINDOW_SECONDS - _now() % WINDOW_SECONDS))


def auth_failure_record(*, address: str, username: str | None = None) -> None:
    """Count one failed authentication of ``address`` (and of ``username``, at the login form)."""
    if _limit() <= 0:
        return
    try:
        for key in _keys(address, username):
            cache.add(key, 0, timeout=WINDOW_SECONDS * 2)
            cache.incr(key)
    except Exception:  # fail open: see the module's docstring
        logger.warning("could not count a failed authentication of %s in the cache", address, exc_info=True)


def auth_failure_throttled(address: str, *, username: str | None = None) -> int | None:
    """Seconds to wait (for ``Retry-After``) if ``address`` or ``username`` has failed too
    often in the current window, else None. Call it before judging credentials, and
    ``auth_failure_record`` when they were refused::

        address = request_client_address(request)   # never REMOTE_ADDR directly
        if (wait := auth_failure_throttled(address)) is not None:
            raise Throttled(wait=wait)                # DRF: 429 with Retry-After
        ...
        if token is None:
            auth_failure_record(address=address)
            raise AuthenticationFailed(...)

    (The middleware and the websocket wrapper do this around today's token authentication;
    an authentication class that calls it itself can take their place.)
    """
    limit = _limit()
    if limit <= 0:
        return None
    try:
        counts = cache.get_many(_keys(address, username))
    except Exception:  # fail open: see the module's docstring
        logger.warning("could not read failed authentications of %s from the cache", address, exc_info=True)
        return None
    if any(int(count) >= limit for count in counts.values()):
        return _retry_after()
    return None


def throttled_detail(retry_after: int) -> str:
    return (
        f"too many failed authentications from this address (more than {_limit()} a minute); "
        f"try again in {retry_after} s"
    )


# --- websockets -----------------------------------------------------------------------------------


class WebsocketAuthFailureThrottle:
    """Counts websockets refused with 4401 per client address, and refuses (4429, after
    accepting, so that the client reads the code; daphne does not pass a close reason on)
    the connections of an address over the limit before they are authenticated. Connections
    of a user logged in to the Studio (the session, resolved by Channels'
    ``AuthMiddlewareStack`` outside this) are neither counted nor refused: they
    authenticated already."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        user = scope.get("user")
        if scope.get("type") != "websocket" or (user is not None and user.is_authenticated):
            return await self.app(scope, receive, send)
        address = scope_client_address(scope)
        wait = await on_db_thread(auth_failure_throttled)(address)
        if wait is not None:
            message = await receive()
            if message.get("type") == "websocket.connect":
                await send({"type": "websocket.accept"})
                reason = throttled_detail(wait).encode()[:120].decode(errors="ignore")
                await send({"type": "websocket.close", "code": CLOSE_THROTTLED, "reason": reason})
            return None

        async def counting_send(message: dict[str, Any]) -> None:
            if message.get("type") == "websocket.close" and message.get("code") == CLOSE_UNAUTHENTICATED:
                await on_db_thread(auth_failure_record)(address=address)
            await send(message)

        return await self.app(scope, receive, counting_send)
