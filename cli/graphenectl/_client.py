"""The REST client: JSON over HTTP with a token, errors turned into actionable ``CliError``\\s.

Standard library only (urllib). Over HTTPS the server's certificate is verified against the
context's pinned CA, else the system's trust store (``graphene_sdk.tls.Trust``). Every API error has one shape,
``{"error": code, "detail": text, "fields": {path: [messages]}}``; it maps to an exit code:
400 → 2 (usage), 404 → 3 (not found), anything else → 1.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphene_sdk.tls import Trust, certificate_error

from graphenectl import __version__
from graphenectl._config import LOGIN_HINT
from graphenectl._errors import EXIT_NOT_FOUND, EXIT_USAGE, CliError

DEFAULT_TIMEOUT = 30.0
API = "/api/v1"
Params = Mapping[str, str | int | bool | Sequence[str] | None]


class TokenRefused(CliError):
    """HTTP 401: the token is unknown to the server (or was revoked)."""


@dataclass(frozen=True)
class Response:
    status: int
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)  # names lowercased


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    next_url: str | None


class Cursor:
    """Follow an append-only stream (events, logs: oldest first by id) by polling its cursor.

    The server's cursor page that was read last is read again until it grows or gains a
    ``next``; items already seen (by id) are skipped. No deadline: the caller decides when to stop.
    """

    def __init__(self, client: Client, path: str, params: Params | None = None, *, page_size: int = 500) -> None:
        self.client = client
        self.url = client.url(path, {**(params or {}), "limit": page_size})
        self.last_id: int | None = None

    def poll(self) -> tuple[list[dict[str, Any]], bool]:
        """New items since the last poll, and whether more are ready right away."""
        page = self.client.page(self.url)
        new = [i for i in page.items if self.last_id is None or i["id"] > self.last_id]
        if new:
            self.last_id = new[-1]["id"]
        if page.next_url:
            self.url = page.next_url
            return new, True
        return new, False


def _is_loopback(host: str) -> bool:
    if host in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def query(params: Params | None) -> str:
    pairs: list[tuple[str, str]] = []
    for key, value in (params or {}).items():
        if value is None or value == "" or value is False:
            continue
        if isinstance(value, bool):
            pairs.append((key, "true"))
        elif isinstance(value, str | int):
            pairs.append((key, str(value)))
        else:
            pairs.extend((key, str(v)) for v in value)
    return urllib.parse.urlencode(pairs)


class Client:
    """One server, one token. Paths are relative to ``/api/v1``."""

    def __init__(
        self, server: str, token: str, *, timeout: float = DEFAULT_TIMEOUT, trust: Trust | None = None
    ) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.trust = trust or Trust()
        parts = urllib.parse.urlsplit(self.server)
        # The same verification for the websockets (the agent terminal) as for the requests.
        self.ssl_context = self.trust.context() if parts.scheme == "https" else None
        # A proxy from the environment must not intercept a server on this machine.
        handlers: list[urllib.request.BaseHandler] = (
            [urllib.request.ProxyHandler({})] if _is_loopback(parts.hostname or "") else []
        )
        if self.ssl_context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=self.ssl_context))
        self._opener = urllib.request.build_opener(*handlers)

    def url(self, path: str, params: Params | None = None) -> str:
        if path.startswith(("http://", "https://")):
            return path
        qs = query(params)
        return f"{self.server}{API}/{path.lstrip('/')}" + (f"?{qs}" if qs else "")

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        timeout: float | None = None,
        extra_headers: dict[str, str] | None = None,
    ) -> Response:
        url = self.url(path, params)
        headers = {
            "Accept": "application/json",
            "Authorization": f"Token {self.token}",
            "User-Agent": f"graphenectl/{__version__}",
            **(extra_headers or {}),
        }
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310 - http(s) only
        try:
            with self._opener.open(req, timeout=timeout or self.timeout) as resp:
                return Response(
                    resp.status,
                    self._decode(resp.read(), url, resp.status),
                    {k.lower(): v for k, v in resp.headers.items()},
                )
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            raise self._http_error(exc.code, raw, url) from None
        except (urllib.error.URLError, OSError) as exc:
            raise self._unreachable(exc) from None

    def open_raw(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        data: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """The raw HTTP response (a file-like object to read in chunks; close it), for bytes
        that must not be held in memory: artifact downloads and uploads (``data`` may be a
        file object, sent as it is read). Errors map as for ``request``."""
        url = self.url(path, params)
        all_headers = {
            "Accept": "*/*",
            "Authorization": f"Token {self.token}",
            "User-Agent": f"graphenectl/{__version__}",
            **(headers or {}),
        }
        req = urllib.request.Request(url, data=data, method=method, headers=all_headers)  # noqa: S310 - http(s) only
        try:
            return self._opener.open(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc.code, exc.read(), url) from None
        except (urllib.error.URLError, OSError) as exc:
            raise self._unreachable(exc) from None

    def get(self, path: str, params: Params | None = None, *, timeout: float | None = None) -> Any:
        return self.request("GET", path, params=params, timeout=timeout).body

    def post(self, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        return self.request("POST", path, body=body if body is not None else {}, timeout=timeout).body

    def page(self, path: str, params: Params | None = None) -> Page:
        body = self.get(path, params)
        if isinstance(body, list):  # not paginated (kinds, stands)
            return Page(body, None)
        return Page(list(body.get("results", [])), body.get("next"))

    def list(self, path: str, params: Params | None = None, *, limit: int | None) -> tuple[list[dict[str, Any]], bool]:
        """Follow ``next`` until ``limit`` items (``None``: all). Returns the items and whether more exist."""
        params = dict(params or {})
        if limit is not None:
            params["limit"] = min(limit, 1000)
        items: list[dict[str, Any]] = []
        page = self.page(path, params)
        while True:
            items.extend(page.items)
            if limit is not None and len(items) >= limit:
                return items[:limit], len(items) > limit or page.next_url is not None
            if not page.next_url:
                return items, False
            page = self.page(page.next_url)

    def cursor(self, path: str, params: Params | None = None) -> Cursor:
        return Cursor(self, path, params)

    # --- errors -----------------------------------------------------------------------------

    def _decode(self, raw: bytes, url: str, status: int) -> Any:
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise CliError(
                f"{url} answered HTTP {status} with something that is not JSON: is {self.server} a Graphene server?",
                hint=LOGIN_HINT,
            ) from None

    def _http_error(self, status: int, raw: bytes, url: str) -> CliError:
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = None
        if not isinstance(body, dict) or "detail" not in body:
            if status == 404:
                return CliError(
                    f"{url} does not exist (HTTP 404, not an API answer): is {self.server} a Graphene server?",
                    hint=LOGIN_HINT,
                )
            # Not the API's error shape (a proxy, or Django's debug page): its first line says enough.
            lines = raw[:2000].decode(errors="replace").strip().splitlines()
            first = lines[0][:200] if lines else "no body"
            return CliError(f"{self.server} answered HTTP {status} for {url}: {first}")
        error = self._answered(status, body, url)
        error.code = str(body["error"]) if body.get("error") else None
        return error

    def _answered(self, status: int, body: dict[str, Any], url: str) -> CliError:
        """The error for an answer in the API's error shape."""
        detail = str(body.get("detail", ""))
        fields = body.get("fields") or {}
        if status == 401:
            return TokenRefused(
                f"the server {self.server} refused the token ({detail}); "
                f"log in again with `graphenectl login --server {self.server} --token-stdin`"
            )
        if status == 403:
            return CliError(f"permission denied by {self.server}: {detail}")
        if status == 404:
            return CliError(detail or f"not found: {url}", exit_code=EXIT_NOT_FOUND)
        if status == 400:
            return CliError(detail or "invalid request", exit_code=EXIT_USAGE, fields=fields)
        if status >= 500:
            return CliError(
                f"server error (HTTP {status}) at {self.server}: {detail}; try again or check its log", retryable=True
            )
        return CliError(f"{detail} (HTTP {status}, {body.get('error', 'error')})", fields=fields)

    def _unreachable(self, exc: BaseException) -> CliError:
        refused = certificate_error(exc)
        if refused is not None:
            return CliError(self.trust.untrusted(self.server, refused))
        reason: Any = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            why = "no answer in time"
        elif isinstance(reason, ConnectionRefusedError):
            why = "connection refused"
        elif isinstance(reason, socket.gaierror):
            why = "unknown host"
        else:
            why = str(reason)
        return CliError(
            f"cannot reach the Graphene server at {self.server} ({why}): is it running? "
            f"Check where this points with `graphenectl ctx show`, or point it elsewhere with `{LOGIN_HINT}`",
            retryable=True,
        )
