"""The client's transport: JSON over HTTP with a token (standard library only), the API's
error shape turned into ``ClientError``, cursor pages, and server-sent event streams.

Every API error has one shape, ``{"error": code, "detail": text, "fields": {path: [...]}}``;
``ClientError`` carries it with the HTTP status (0: the server could not be reached).
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import json
import queue
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Generic, TypeVar

from graphene_sdk._errors import ClientError
from graphene_sdk.tls import Trust, certificate_error
from graphene_sdk.validation import json_problems

API = "/api/v1"
USER_AGENT = "graphene-sdk/0.1"
# Bytes per read of a download (and of an upload sent from a file).
CHUNK = 1024 * 1024

Params = Mapping[str, str | int | bool | Sequence[str] | None]
T = TypeVar("T")


def _is_loopback(host: str) -> bool:
    if host in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refuse_unsendable(body: Any, method: str, path: str) -> None:
    """Refuse, before sending, a body the server would refuse for what it holds (a NUL
    character, a lone surrogate, a number JSON cannot carry, too deep): the same rules, the
    same error (400, ``validation_failed``, by path), and no request."""
    problems = json_problems(body)
    if problems:
        summary = "; ".join(f"{where}: {messages[0]}" for where, messages in problems.items())
        raise ClientError(
            f"{method} {path}: not sent: {summary}", status=400, code="validation_failed", fields=problems
        )


def query(params: Params | None) -> str:
    """The query string of ``params``: ``None``, ``""`` and ``False`` are left out, lists repeat."""
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


class Transport:
    """One server, one token. Paths are relative to ``/api/v1``; absolute URLs (a page's
    ``next``) are taken as they are. Over HTTPS every connection verifies the server's
    certificate against ``trust`` (its pinned CA, else the system's trust store)."""

    def __init__(self, server: str, token: str, *, timeout: float, trust: Trust | None = None) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.trust = trust or Trust()
        parts = urllib.parse.urlsplit(self.server)
        self.host = parts.hostname or ""
        self.is_https = parts.scheme == "https"
        self.port = parts.port or (443 if self.is_https else 80)
        self.ssl_context = self.trust.context() if self.is_https else None
        # A proxy from the environment must not intercept a server on this machine.
        handlers: list[urllib.request.BaseHandler] = (
            [urllib.request.ProxyHandler({})] if _is_loopback(self.host) else []
        )
        if self.ssl_context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=self.ssl_context))
        self._opener = urllib.request.build_opener(*handlers)

    def url(self, path: str, params: Params | None = None) -> str:
        if path.startswith(("http://", "https://")):
            return path
        qs = query(params)
        return f"{self.server}{API}/{path.lstrip('/')}" + (f"?{qs}" if qs else "")

    def headers(self, accept: str = "application/json") -> dict[str, str]:
        return {"Accept": accept, "Authorization": f"Token {self.token}", "User-Agent": USER_AGENT}

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Any:
        """The decoded JSON answer (None for an empty one)."""
        url = self.url(path, params)
        headers = {**self.headers(), **(extra_headers or {})}
        data = None
        if body is not None:
            refuse_unsendable(body, method, path)
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310 - http(s) only
        with self._open(request, method, path) as response:
            raw = response.read()
            status = response.status
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ClientError(
                f"{method} {path}: {url} answered HTTP {status} with something that is not JSON: "
                f"is {self.server} a Graphene server?",
                status=status,
            ) from None

    def get(self, path: str, params: Params | None = None) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None, params: Params | None = None) -> Any:
        return self.request("POST", path, params=params, body=body if body is not None else {})

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
        """The raw HTTP response, to read in chunks (close it): downloads, and uploads of a
        file object sent as it is read. Errors map as for ``request``."""
        url = self.url(path, params)
        request = urllib.request.Request(  # noqa: S310 - http(s) only
            url, data=data, method=method, headers={**self.headers("*/*"), **(headers or {})}
        )
        return self._open(request, method, path, timeout=timeout)

    def _open(self, request: urllib.request.Request, method: str, path: str, *, timeout: float | None = None) -> Any:
        try:
            return self._opener.open(request, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as exc:
            raise self.http_error(method, path, exc.code, exc.read()) from None
        except (urllib.error.URLError, OSError) as exc:
            raise self.unreachable(method, path, exc) from None

    def http_error(self, method: str, path: str, status: int, raw: bytes) -> ClientError:
        """The server's error answer as a ``ClientError`` (its ``error``, ``detail``, ``fields``)."""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        where = f"{method} {self.url(path).removeprefix(self.server)}"
        if not isinstance(body, dict) or "detail" not in body:
            # Not the API's error shape (a proxy, a web server in front): its first line says enough.
            lines = raw[:2000].decode(errors="replace").strip().splitlines()
            first = lines[0][:200] if lines else "no body"
            return ClientError(
                f"{where}: HTTP {status} from {self.server}, not a Graphene API answer "
                f"(is it a Graphene server?): {first}",
                status=status,
            )
        detail = str(body.get("detail", ""))
        code = str(body.get("error", "") or "")
        fields = body.get("fields") or {}
        message = f"{where}: {detail} (HTTP {status}{', ' + code if code else ''})"
        if status == 401:
            message += f"; log in again with `graphenectl login --server {self.server} --token-stdin`"
        return ClientError(message, status=status, code=code, detail=detail, fields=fields)

    def unreachable(self, method: str, path: str, exc: BaseException) -> ClientError:
        refused = certificate_error(exc)
        if refused is not None:
            return ClientError(
                f"{method} {path}: {self.trust.untrusted(self.server, refused)}", status=0, code="untrusted_certificate"
            )
        reason: Any = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            why = "no answer in time"
        elif isinstance(reason, ConnectionRefusedError):
            why = "connection refused"
        elif isinstance(reason, socket.gaierror):
            why = "unknown host"
        else:
            why = str(reason)
        return ClientError(
            f"{method} {path}: cannot reach the Graphene server at {self.server} ({why}): is it running?",
            status=0,
            code="unreachable",
        )

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        """A connection of its own (for a stream that is closed from another thread).
        Proxies are not used for it."""
        if self.is_https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.ssl_context)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


# --- pages -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing: its items and the URL of the next page (None: the last one)."""

    items: tuple[T, ...]
    next_url: str | None


class Paged(Generic[T]):
    """A listing the server answers in cursor pages. Iterating yields every item, fetching
    the next page only when the previous one is used up; ``pages()`` yields whole pages.
    Nothing is fetched before you iterate; iterating again starts from the first page."""

    def __init__(
        self,
        transport: Transport,
        path: str,
        params: Params,
        parse: Callable[[dict[str, Any]], T],
        *,
        page_size: int,
        keep: Callable[[T], bool] | None = None,
    ) -> None:
        if not 1 <= page_size <= 1000:
            raise ValueError(f"page_size must be between 1 and 1000, not {page_size}")
        self._transport = transport
        self._path = path
        self._params = {**params, "limit": page_size}
        self._parse = parse
        self._keep = keep

    def pages(self) -> Iterator[Page[T]]:
        url: str | None = self._transport.url(self._path, self._params)
        while url:
            body = self._transport.get(url)
            if isinstance(body, list):  # an unpaginated listing is one page
                body = {"results": body, "next": None}
            items = tuple(map(self._parse, body.get("results", [])))
            if self._keep is not None:  # what the server lists but the caller did not ask for
                items = tuple(filter(self._keep, items))
            url = body.get("next")
            yield Page(items, url)

    def __iter__(self) -> Iterator[T]:
        for page in self.pages():
            yield from page.items

    def first(self, n: int) -> list[T]:
        """At most ``n`` items (fetching no more pages than needed)."""
        items: list[T] = []
        if n <= 0:
            return items
        for item in self:
            items.append(item)
            if len(items) >= n:
                break
        return items


# --- server-sent events ------------------------------------------------------------------------


@dataclass(frozen=True)
class SseEvent:
    """One server-sent event: its ``id`` (the Last-Event-ID to resume after), type and data."""

    id: str
    event: str
    data: str


_END = object()


class EventStream:
    """Reads a server-sent event stream on a thread of its own, reconnecting (with the last
    event's id as ``Last-Event-ID``) after a dropped connection, so that the reader can wait
    for the next event with a deadline (``get``) and stop at any time (``close``).

    ``read_timeout`` bounds the silence on a live connection: the server sends a keep-alive
    comment every 15 s, so a longer silence means the connection is dead.
    """

    def __init__(self, transport: Transport, path: str, params: Params, *, read_timeout: float = 45.0) -> None:
        self._transport = transport
        url = urllib.parse.urlsplit(transport.url(path, params))
        self._target = url.path + (f"?{url.query}" if url.query else "")  # a server under a path keeps it
        self._path = path
        self._read_timeout = read_timeout
        self._events: queue.Queue[Any] = queue.Queue()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._connection: http.client.HTTPConnection | None = None
        self.last_id = ""
        self._thread = threading.Thread(target=self._run, name=f"graphene-sse {path}", daemon=True)
        self._thread.start()

    def get(self, timeout: float) -> SseEvent | None:
        """The next event, or None if none came within ``timeout`` seconds. Raises the
        ``ClientError`` that ended the stream (a 404, a refused token)."""
        try:
            item = self._events.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise item
        if item is _END:
            self._events.put(_END)
            return None
        event: SseEvent = item
        return event

    def close(self) -> None:
        """Stop reading: the connection is shut down at once (which wakes the reading thread)."""
        self._closed.set()
        with self._lock:
            connection = self._connection
        if connection is not None and connection.sock is not None:
            with contextlib.suppress(OSError):  # already gone
                connection.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        delay = 0.2
        while not self._closed.is_set():
            try:
                self._read_once()
                delay = 0.2  # a connection that worked: reconnect at once
            except ClientError as exc:
                if exc.status != 0 and exc.status < 500:  # refused (404, 401): it will not get better
                    self._events.put(exc)
                    return
                self._closed.wait(delay)  # unreachable or failing: try again, backing off
                delay = min(delay * 2, 5.0)
            except (OSError, http.client.HTTPException):  # the connection dropped
                self._closed.wait(delay)
                delay = min(delay * 2, 5.0)
        self._events.put(_END)

    def _read_once(self) -> None:
        connection = self._transport.connection(self._read_timeout)
        with self._lock:
            if self._closed.is_set():
                return
            self._connection = connection
        try:
            headers = self._transport.headers("text/event-stream")
            headers["Cache-Control"] = "no-cache"
            if self.last_id:
                headers["Last-Event-ID"] = self.last_id
            try:
                connection.request("GET", self._target, headers=headers)
                response = connection.getresponse()
            except OSError as exc:
                raise self._transport.unreachable("GET", self._path, exc) from None
            if response.status != 200:
                raise self._transport.http_error("GET", self._path, response.status, response.read())
            self._parse(response)
        finally:
            with self._lock:
                self._connection = None
            connection.close()

    def _parse(self, response: IO[bytes]) -> None:
        event_id, event_type = "", "message"
        data: list[str] = []
        while not self._closed.is_set():
            raw = response.readline()
            if not raw:
                return  # the server closed the stream
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if not line:
                if data:
                    if event_id:
                        self.last_id = event_id
                    self._events.put(SseEvent(event_id or self.last_id, event_type, "\n".join(data)))
                event_id, event_type, data = "", "message", []
                continue
            if line.startswith(":"):
                continue  # a comment: the keep-alive
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "id":
                event_id = value
            elif name == "event":
                event_type = value
            elif name == "data":
                data.append(value)
