"""A TCP relay on loopback between a client and a server, for faults no real network is asked
to make on cue: ``cut()`` refuses new connections and drops the open ones (a broker going away),
and ``drop`` swallows HTTP answers after the server gave them (a proxy or a
load balancer losing a response, chosen by ``drop``), so a client cannot tell whether its request took effect.

Clients here send one request per connection (urllib sends ``Connection: close``); an answer
is read by its ``Content-Length``.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable


def _read_answer(upstream: socket.socket) -> bytes:
    """One HTTP answer: its head, then ``Content-Length`` bytes of body (or all until the server
    closes, for an answer without one)."""
    answer = bytearray()
    while b"\r\n\r\n" not in answer:
        chunk = upstream.recv(65536)
        if not chunk:
            return bytes(answer)
        answer.extend(chunk)
    head, _, body = bytes(answer).partition(b"\r\n\r\n")
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while length is None or len(body) < length:
        chunk = upstream.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


HEAD = 4096


class Relay:
    def __init__(
        self,
        target_port: int,
        *,
        drop: Callable[[bytes], bool] | None = None,
        upstream_tls: ssl.SSLContext | None = None,
    ) -> None:
        """``drop``: given the head of a request (its first 4 KiB), whether to swallow the
        server's answer to it (None: relay everything as it comes). ``upstream_tls``: speak TLS
        to the server (clients speak plain HTTP to the relay, which reads what it relays), as a
        proxy that terminates TLS does."""
        self.target_port = target_port
        self.drop = drop
        self.upstream_tls = upstream_tls
        self.dropped = 0
        self.relayed = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.port = int(self._listener.getsockname()[1])
        self._open = True
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.add(sock)
        return sock

    def _accept(self) -> None:
        while self._open:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._open:  # came in as the relay was cut
                self._close(client)
                return
            threading.Thread(target=self._serve, args=(self._track(client),), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            raw = socket.create_connection(("127.0.0.1", self.target_port), timeout=60)
            if self.upstream_tls is not None:
                raw = self.upstream_tls.wrap_socket(raw, server_hostname="127.0.0.1")
            upstream = self._track(raw)
        except OSError:
            client.close()
            return
        head = bytearray()
        got_head = threading.Event()

        def forward() -> None:  # client → server, keeping the request's head
            try:
                while chunk := client.recv(65536):
                    if len(head) < HEAD:
                        head.extend(chunk[: HEAD - len(head)])
                    if b"\r\n\r\n" in head or len(head) >= HEAD:
                        got_head.set()
                    upstream.sendall(chunk)
            except OSError:
                pass
            finally:
                got_head.set()
                with contextlib.suppress(OSError):
                    upstream.shutdown(socket.SHUT_WR)

        threading.Thread(target=forward, daemon=True).start()
        try:
            if self.drop is None:
                while chunk := upstream.recv(65536):  # a plain relay: bytes as they come
                    client.sendall(chunk)
                return
            answer = _read_answer(upstream)
            got_head.wait(timeout=10)
            if answer and self.drop(bytes(head)):
                with self._lock:
                    self.dropped += 1
                return  # the server answered; the client never hears it
            client.sendall(answer)
            with self._lock:
                self.relayed += 1
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                self._close(sock)

    def _close(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)
        with contextlib.suppress(OSError):  # shutdown first: a thread blocked in recv keeps close() from hanging up
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()

    def cut(self) -> None:
        """Refuse new connections and drop every open one, as a server that went away."""
        self._open = False
        # Shut down first: a thread blocked in accept() keeps the socket listening after close(),
        # and would take (and relay) one more connection.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            live = list(self._sockets)
        for sock in live:
            self._close(sock)

    close = cut
