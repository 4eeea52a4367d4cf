"""One HTTP request to the Docker engine of an agent's machine, as one self-contained function.

``engine_http`` is sent as an agent's ``call`` command (``kinds.docker._agent``): it uses only
the standard library and imports inside its body, because only its source travels. It speaks
HTTP/1.1 to the engine at ``DOCKER_HOST`` on the machine (``unix://`` or plain ``tcp://``),
else ``/var/run/docker.sock``, and answers with the status, headers and body (base64).

A command carries at most 512 KiB of arguments and returns at most 512 KiB, so bodies larger
than ``chunk`` bytes are spooled in a private directory on the machine: ``put`` appends a
piece of a request body (sent before the ``request``), ``get`` reads a piece of a response
body the ``request`` could not return whole. Spool files are named by a token the server
chose for the request and removed once used; any older than an hour are removed too.
"""

from __future__ import annotations

from typing import Any


def engine_http(
    op: str,
    token: str,
    offset: int = 0,
    data_b64: str = "",
    method: str = "GET",
    path: str = "/",
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
    chunk: int = 368_640,
    redact_env: bool = False,
) -> dict[str, Any]:
    """``put`` (a piece of the request body), ``request`` (send it; ``spooled``: the body was
    put), ``get`` (a piece of a spooled response). Transport failures are answers, not
    exceptions: ``{"error": "connect" | "timeout", "message"}``."""
    import base64
    import http.client
    import json
    import os
    import socket
    import tempfile
    import time

    if not token.isalnum():
        raise ValueError(f"bad spool token {token!r}")
    spool = os.path.join(tempfile.gettempdir(), f"graphene-docker-{os.getuid()}")
    request_file = os.path.join(spool, token + ".request")
    response_file = os.path.join(spool, token + ".response")

    if op == "put":
        os.makedirs(spool, mode=0o700, exist_ok=True)
        if offset == 0:  # a new upload: forget what crashed uploads left behind
            for name in os.listdir(spool):
                stale = os.path.join(spool, name)
                try:
                    if time.time() - os.stat(stale).st_mtime > 3600:
                        os.unlink(stale)
                except OSError:
                    pass
        # Written at its offset: a piece delivered twice (a reconnect) is written twice, harmlessly.
        fd = os.open(request_file, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.lseek(fd, offset, os.SEEK_SET)
            view = memoryview(base64.b64decode(data_b64))
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        return {"size": os.path.getsize(request_file)}

    if op == "get":
        with open(response_file, "rb") as handle:
            handle.seek(offset)
            data = handle.read(chunk)
        more = offset + len(data) < os.path.getsize(response_file)
        if not more:
            os.unlink(response_file)
        return {"body": base64.b64encode(data).decode(), "more": more}

    if op not in ("request", "spooled"):
        raise ValueError(f"unknown operation {op!r}")
    if op == "spooled":
        with open(request_file, "rb") as handle:
            body = handle.read()
        os.unlink(request_file)
    else:
        body = base64.b64decode(data_b64)

    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if host.startswith("unix://"):
        socket_path = host[len("unix://") :]

        class UnixConnection(http.client.HTTPConnection):
            def connect(self) -> None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self.timeout)
                sock.connect(socket_path)
                self.sock = sock

        connection: http.client.HTTPConnection = UnixConnection("localhost", timeout=timeout)
    elif host.startswith("tcp://"):
        connection = http.client.HTTPConnection(host[len("tcp://") :].rstrip("/"), timeout=timeout)
    else:
        raise ValueError(f"DOCKER_HOST={host} on this machine: only unix:// and tcp:// (no TLS) are supported")
    try:
        try:
            connection.request(
                method, path, body=body if body or method in ("POST", "PUT") else None, headers=headers or {}
            )
        except OSError as exc:
            return {"error": "connect", "message": f"cannot reach the Docker engine at {host}: {exc}"}
        try:
            response = connection.getresponse()
            data = response.read()
        except (TimeoutError, socket.timeout) as exc:  # noqa: UP041  # distinct before Python 3.10 (the machine may run 3.9)
            return {"error": "timeout", "message": f"no answer from the Docker engine within {timeout}s: {exc}"}
        except OSError as exc:
            return {"error": "connect", "message": f"the Docker engine at {host} broke off: {exc}"}
    finally:
        connection.close()

    answer_headers = [[k, v] for k, v in response.getheaders() if k.lower() not in ("transfer-encoding", "connection")]
    if redact_env and data[:1] == b"{" and b'"Env"' in data:
        # The container's environment holds secrets' values: they never travel back (I7).
        try:
            document = json.loads(data)
        except ValueError:
            document = None
        config = document.get("Config") if isinstance(document, dict) else None
        if isinstance(config, dict) and isinstance(config.get("Env"), list):
            config["Env"] = [str(item).split("=", 1)[0] + "=<redacted>" for item in config["Env"]]
            data = json.dumps(document).encode()
            answer_headers = [[k, v] for k, v in answer_headers if k.lower() != "content-length"]
    answer: dict[str, Any] = {
        "status": response.status,
        "reason": response.reason,
        "headers": answer_headers,
        "size": len(data),
        "more": len(data) > chunk,
    }
    if len(data) > chunk:
        os.makedirs(spool, mode=0o700, exist_ok=True)
        fd = os.open(response_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data[chunk:])
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        data = data[:chunk]
    answer["body"] = base64.b64encode(data).decode()
    return answer
