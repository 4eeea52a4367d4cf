"""Opening a websocket to a test web server with websockets' synchronous client, over TLS.

That client reads its socket on a thread of its own while the caller writes the opening
request; on a loaded machine it has been seen (about once in a hundred opens) to finish the TLS
handshake and then never deliver its request: the server's log shows no attempt from the
client's port, while the server answers everything else; the same race has also ended the
opening with OpenSSL's "internal error" on the client's side. ``open_ws`` opens again then,
and only then (at most ``ATTEMPTS`` opens in all); a server that received the request and did
not answer fails the test. (Graphene's own clients, graphenectl and the agent, use the asyncio
client.)"""

from __future__ import annotations

import socket
import ssl
from pathlib import Path
from typing import Any

from websockets.exceptions import ConnectionClosedError
from websockets.sync.client import ClientConnection, connect

from tests.harness import tls

# Opens that never reached the server before the test fails (each one the client's stall).
ATTEMPTS = 3


def _open(host: str, port: int, url: str, timeout: float, **options: Any) -> tuple[ClientConnection | None, int]:
    sock = socket.create_connection((host, port), timeout=timeout)
    local = sock.getsockname()[1]
    try:
        return connect(url, sock=sock, proxy=None, open_timeout=timeout, **options), local
    except TimeoutError:
        sock.close()
        return None, local
    except ConnectionClosedError as closed:
        # The client's race, as websockets reports it: the connection closed from an SSLError.
        if not isinstance(closed.__cause__, ssl.SSLError):
            raise
        sock.close()
        return None, local


def open_ws(url: str, *, log: Path, timeout: float = 10, **options: Any) -> ClientConnection:
    """``websockets.sync.client.connect(url, **options)`` against the server writing ``log``
    (its access log names each client's port); TLS with the session's CA unless ``ssl`` is given."""
    scheme, _, rest = url.partition("://")
    hostport = rest.split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if scheme == "wss":
        options.setdefault("ssl", tls.context())
        options.setdefault("server_hostname", host)
    for attempt in range(1, ATTEMPTS + 1):
        ws, local = _open(host, int(port), url, timeout, **options)
        if ws is not None:
            return ws
        if f":{local} - - " in log.read_text(errors="replace"):
            raise AssertionError(f"the server received the opening handshake from port {local} and did not answer")
        print(f"the opening handshake from port {local} never reached the server (attempt {attempt})")
    raise AssertionError(f"{ATTEMPTS} opening handshakes in a row never reached the server ({timeout}s each)")
