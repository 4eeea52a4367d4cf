"""Loopback networking for tests: free ports and a small JSON-over-HTTP(S) client.

HTTPS is verified against the session's CA (``tests.harness.tls``), or the CA a request names
(``context=``: a ``graphene up`` of the test's own has a CA of its own).
"""

from __future__ import annotations

import functools
import json
import socket
import ssl
import urllib.error
import urllib.request
from typing import Any


@functools.cache
def _opener(context: ssl.SSLContext | None) -> urllib.request.OpenerDirector:
    from tests.harness import tls

    # Tests talk to loopback only: no proxy from the environment may sit in between.
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context or tls.context())
    )


class _Opener:
    """``opener.open(...)``: urllib without proxies, trusting the session's CA (made on first use)."""

    def open(self, request: Any, *, timeout: float = 30) -> Any:
        return _opener(None).open(request, timeout=timeout)


opener = _Opener()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fetch(
    url: str,
    *,
    token: str | None = None,
    scheme: str = "Token",
    timeout: float = 30,
    context: ssl.SSLContext | None = None,
) -> tuple[int, bytes]:
    """GET ``url``; the status and the raw body (errors too: a 4xx is an answer, not an exception)."""
    request = urllib.request.Request(url, headers={"Authorization": f"{scheme} {token}"} if token else {})  # noqa: S310
    try:
        with _opener(context).open(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def fetch_response(
    url: str, *, headers: dict[str, str] | None = None, timeout: float = 30, context: ssl.SSLContext | None = None
) -> tuple[int, dict[str, str], bytes]:
    """GET ``url`` without following redirects; the status, the headers and the raw body."""
    from tests.harness import tls

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310
    plain = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context or tls.context()), NoRedirect
    )
    try:
        with plain.open(request, timeout=timeout) as response:
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers.items()), exc.read()


def http(
    method: str,
    url: str,
    *,
    token: str | None = None,
    body: Any = None,
    timeout: float = 30,
    context: ssl.SSLContext | None = None,
) -> tuple[int, Any]:
    """One JSON request; the status and the body (JSON decoded, ``None`` when empty, else bytes)."""
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Token {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310  # http(s) only
    try:
        with _opener(context).open(request, timeout=timeout) as response:
            return response.status, _decode(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, _decode(exc.read())


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    return json.loads(raw) if raw.lstrip()[:1] in (b"{", b"[") else raw
