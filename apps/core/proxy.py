"""Proxy headers, believed only from the proxies named in ``GRAPHENE_TRUSTED_PROXIES``.

Behind a TLS-terminating proxy the web process sees plain HTTP from the proxy's address; the
proxy says in ``X-Forwarded-Proto`` whether its client used HTTPS and in ``X-Forwarded-For``
who that client was. Anyone who can reach the web process directly could send the same headers
and be taken for a secure request from anywhere, so this ASGI middleware, around the whole
application (HTTP and websockets), decides once per connection:

* from a trusted peer, the scheme (``https``/``wss`` or ``http``/``ws``) and the client
  address are taken from the headers, and the headers are kept (Django's
  ``SECURE_PROXY_SSL_HEADER`` reads the same ``X-Forwarded-Proto``);
* from anyone else every ``X-Forwarded-*`` and ``Forwarded`` header is removed before any
  of Graphene's code sees the request.

Daphne's own ``--proxy-headers`` trusts every peer, which is why the ``graphene`` command
never turns it on.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_FORWARDED = (b"x-forwarded-", b"forwarded")


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("["):  # [::1]:port
        text = text[1 : text.find("]")] if "]" in text else text
    elif text.count(":") == 1:  # 10.0.0.1:port
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def is_trusted(host: str | None, networks: Iterable[Network]) -> bool:
    """Whether a peer at ``host`` is one of the trusted proxies."""
    address = _address(host or "")
    return address is not None and any(address in network for network in networks)


def forwarded_scope(scope: Scope, networks: tuple[Network, ...]) -> Scope:
    """The scope the application sees: rewritten from a trusted proxy's headers, or with
    any proxy headers removed when the peer is not a trusted proxy."""
    if scope.get("type") not in {"http", "websocket"}:
        return scope
    headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or [])
    client = scope.get("client")
    peer = client[0] if client else None
    if not networks or not is_trusted(peer, networks):
        kept = [(name, value) for name, value in headers if not name.lower().startswith(_FORWARDED)]
        if len(kept) == len(headers):
            return scope
        return {**scope, "headers": kept}
    scope = dict(scope)
    proto = _header(headers, b"x-forwarded-proto")
    if proto:
        secure = proto.split(",")[0].strip().lower() == "https"
        if scope["type"] == "websocket":
            scope["scheme"] = "wss" if secure else "ws"
        else:
            scope["scheme"] = "https" if secure else "http"
    hops = _header(headers, b"x-forwarded-for")
    if hops:
        # The nearest untrusted hop is the client: proxies append, so read from the right and
        # skip our own proxies (a client may put anything at the left end).
        chain = [hop.strip() for hop in hops.split(",") if hop.strip()]
        client_host = next((hop for hop in reversed(chain) if not is_trusted(hop, networks)), chain[0])
        address = _address(client_host)
        if address is not None:
            scope["client"] = (str(address), 0)
    return scope


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str:
    values = [value.decode("latin-1") for key, value in headers if key.lower() == name]
    return ",".join(values)


class TrustedProxyMiddleware:
    """ASGI middleware applying ``forwarded_scope`` with the settings' trusted proxies."""

    def __init__(self, app: ASGIApp, *, networks: tuple[Network, ...] | None = None) -> None:
        self.app = app
        if networks is None:
            from django.conf import settings

            networks = tuple(settings.GRAPHENE_TRUSTED_PROXIES)
        self.networks = networks

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        await self.app(forwarded_scope(scope, self.networks), receive, send)
