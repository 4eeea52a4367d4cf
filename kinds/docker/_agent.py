"""The docker kinds on an agent's machine: a docker-py client whose HTTP transport is the agent.

docker-py's ``APIClient`` is a ``requests.Session``; ``agent_client`` mounts ``AgentAdapter``
for a pseudo base URL (``http://graphene-agent:2375``, never resolved), whose ``send`` turns
each HTTP request into one call of ``_engine_http.engine_http`` on the machine, which speaks
HTTP/1.1 to the engine's socket there. The kinds' code is the same on
the server and on an agent: only ``_common.client()`` changes, for the time a kind method
runs under ``on_engine`` with ``agent`` in the record's spec.

Each request is one ``machines().request`` (``kinds.machine``): a call waited for in place (a
kind runs synchronously in a worker), which the machine answers with the engine's response
as a dict, from which a ``requests.Response`` is built here. The calls are ``in_process``, so
Graphene's agents app sends them as live calls over the agent's connection (no command row,
a few milliseconds each: ``apps/agents/live.py``), or as ``call`` commands with the operation
``OPERATION`` to an agent that does not serve live calls.

An agent that is not connected (or leaves while a request is in flight: the request ends
unanswered) makes the operation stop, as ``kinds.machine`` says for the record's purpose:
``NotYet`` while the agent is only away (a create is called again later without counting an
attempt; an observation looks again next interval), ``KindError`` once the agent is lost,
and for a deletion the lost-machine deadline (past it, ``Abandoned``: ``on_agent`` records
what may be left).

Streaming: none of the kinds follows a stream (logs are read with ``since``/``tail``, stats
with ``stream=False``, a job's exit is a bounded long poll), so single requests suffice. A
pull's progress arrives whole when the pull ends, and must end within the call's timeout.
Bodies larger than one command carries are sent or fetched in pieces of ``CHUNK_BYTES``, up to
``MAX_UPLOAD_BYTES`` (an image's root file system tar) and ``MAX_DOWNLOAD_BYTES``.
"""

from __future__ import annotations

import base64
import io
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import docker
import docker.constants
import requests
import requests.adapters
import requests.exceptions
import urllib3
from requests.structures import CaseInsensitiveDict
from requests.utils import get_encoding_from_headers

from kinds import KindError, PermanentError
from kinds.docker._engine_http import engine_http
from kinds.machine import Abandoned, Call, Purpose, machines

if TYPE_CHECKING:
    from apps.records.models import Record

BASE_URL = "tcp://graphene-agent:2375"  # docker-py makes it http://graphene-agent:2375
# The requests' name, in messages and on their commands (whose operation is ``sync:docker``).
NAME = "docker"
OPERATION = f"sync:{NAME}"
# Raw bytes per piece of a body: as base64 in JSON, well inside a call's 512 KiB.
CHUNK_BYTES = 360 * 1024
MAX_UPLOAD_BYTES = 64 * 1024 * 1024
MAX_DOWNLOAD_BYTES = 64 * 1024 * 1024
# docker-py passes no timeout for imports and pulls: how long one may take on the machine.
UNBOUNDED_REQUEST_S = 900.0


@dataclass(frozen=True)
class Target:
    """What the docker kinds act for: the record, its agent, and whether it is being deleted
    (``create``, ``observe`` or ``delete``: they differ when the agent is away)."""

    record: Record
    agent_id: str
    mode: Purpose
    sealed: bool


_target: ContextVar[Target | None] = ContextVar("graphene_docker_agent_target", default=None)
_local = threading.local()


def current() -> Target | None:
    return _target.get()


def _has_secret_env(record: Record) -> bool:
    env = record.spec.get("env") or {}
    return any(isinstance(value, Mapping) and "$secret" in value for value in env.values())


@contextmanager
def on_agent(record: Record, mode: Purpose) -> Iterator[Target | None]:
    """Within: ``client()`` is the engine of the record's agent (if its spec names one).

    A deletion given up on (the machine is gone for good) is recorded here and ends quietly:
    the record is deleted, and an event names what may be left on the machine.
    """
    agent_id = (record.spec or {}).get("agent")
    if not agent_id:
        yield None
        return
    target = Target(record=record, agent_id=str(agent_id), mode=mode, sealed=_has_secret_env(record))
    token = _target.set(target)
    try:
        yield target
    except Abandoned as exc:
        if mode != "delete":
            raise KindError(str(exc)) from exc
        machines().abandon(record, exc, left=f"the {record.kind} objects labelled graphene.record={record.pk}")
    finally:
        _target.reset(token)


def agent_client(agent_id: str) -> docker.DockerClient:
    """A client of the engine on ``agent_id``'s machine, one per thread (like ``client()``).

    Made with the oldest API version docker-py speaks, so that no request goes out before the
    adapter is mounted; then the engine's own version is asked for (one command, once).
    """
    import os

    clients: dict[tuple[int, str], docker.DockerClient] = _local.__dict__.setdefault("clients", {})
    key = (os.getpid(), agent_id)
    cached = clients.get(key)
    if cached is not None:
        return cached
    made = docker.DockerClient(base_url=BASE_URL, version=docker.constants.MINIMUM_DOCKER_API_VERSION, timeout=60)
    made.api.trust_env = False  # no proxies: the URL is a name for the agent, never dialled
    made.api.mount(made.api.base_url, AgentAdapter(agent_id))
    made.api._version = str(made.api.version(api_version=False)["ApiVersion"])
    clients[key] = made
    return made


class _Body(io.BytesIO):
    # docker-py's stream helper asks the raw response whether it is chunked: it is not (whole).
    chunked = False


def _body_bytes(body: Any) -> bytes:
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    if hasattr(body, "read"):
        data = body.read()
        return data.encode() if isinstance(data, str) else bytes(data)
    return b"".join(part.encode() if isinstance(part, str) else bytes(part) for part in body)


def _read_timeout(timeout: Any) -> float:
    if isinstance(timeout, tuple):
        timeout = timeout[1]
    return UNBOUNDED_REQUEST_S if timeout is None else float(timeout)


class AgentAdapter(requests.adapters.BaseAdapter):
    """Sends each request as one call to the agent's machine (see the module's docstring)."""

    def __init__(self, agent_id: str) -> None:
        super().__init__()
        self.agent_id = agent_id

    def close(self) -> None:
        """Nothing to close: each request is a call of its own."""

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: Any = None,
    ) -> requests.Response:
        target = current()
        if target is None or target.agent_id != self.agent_id:
            raise KindError(f"a request for the engine on agent {self.agent_id} outside of its record's operation")
        body = _body_bytes(request.body)
        if len(body) > MAX_UPLOAD_BYTES:
            raise PermanentError(
                f"a request body of {len(body)} bytes for the engine on agent {self.agent_id} is more than the "
                f"{MAX_UPLOAD_BYTES} bytes ({MAX_UPLOAD_BYTES // 2**20} MiB) sent through an agent"
            )
        seconds = _read_timeout(timeout)
        token = uuid.uuid4().hex
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in ("host", "content-length", "transfer-encoding", "connection", "accept-encoding")
        }
        common = {"token": token, "chunk": CHUNK_BYTES}
        if len(body) > CHUNK_BYTES:
            for offset in range(0, len(body), CHUNK_BYTES):
                piece = base64.b64encode(body[offset : offset + CHUNK_BYTES]).decode()
                self._call(target, {**common, "op": "put", "offset": offset, "data_b64": piece}, 60.0)
            first = {"op": "spooled"}
        else:
            first = {"op": "request", "data_b64": base64.b64encode(body).decode()}
        answer = self._call(
            target,
            {
                **common,
                **first,
                "method": request.method or "GET",
                "path": request.path_url,
                "headers": headers,
                "timeout": seconds,
                "redact_env": target.sealed,
            },
            seconds,
        )
        if answer.get("error") == "timeout":
            raise requests.exceptions.ReadTimeout(answer.get("message"), request=request)
        if answer.get("error"):
            raise requests.exceptions.ConnectionError(answer.get("message"), request=request)
        data = base64.b64decode(answer["body"])
        if answer.get("more"):
            if int(answer.get("size") or 0) > MAX_DOWNLOAD_BYTES:
                raise KindError(
                    f"an answer of {answer['size']} bytes from the engine on agent {self.agent_id} is more than "
                    f"the {MAX_DOWNLOAD_BYTES} bytes fetched through an agent"
                )
            parts, offset, more = [data], 0, True
            while more:
                fetched = self._call(target, {**common, "op": "get", "offset": offset}, 60.0)
                chunk = base64.b64decode(fetched["body"])
                parts.append(chunk)
                offset += len(chunk)
                more = bool(fetched.get("more")) and bool(chunk)
            data = b"".join(parts)
        return self._response(request, answer, data)

    def _response(self, request: requests.PreparedRequest, answer: dict[str, Any], data: bytes) -> requests.Response:
        response = requests.Response()
        response.status_code = int(answer["status"])
        response.reason = str(answer.get("reason") or "")
        response.headers = CaseInsensitiveDict({str(k): str(v) for k, v in answer.get("headers") or []})
        response.raw = urllib3.HTTPResponse(
            body=_Body(data),
            headers=dict(response.headers),
            status=response.status_code,
            reason=response.reason,
            preload_content=False,
            decode_content=False,
        )
        response.encoding = get_encoding_from_headers(response.headers)
        response.url = request.url or ""
        response.request = request
        response.connection = self  # type: ignore[assignment]  # typed as HTTPAdapter; any adapter is what requests keeps
        return response

    def _call(self, target: Target, kwargs: dict[str, Any], seconds: float) -> dict[str, Any]:
        """``engine_http(**kwargs)`` on the machine: its answer (a dict), once it is back."""
        call = Call(
            engine_http,
            kwargs=kwargs,
            sealed=target.sealed,  # the container's environment may carry secrets' values (I7)
            in_process=True,  # bounded by its own timeout: no interpreter per request, and it may go live
        )
        value = machines().request(target.record, self.agent_id, NAME, call, purpose=target.mode, timeout=seconds)
        if not isinstance(value, dict):
            raise KindError(
                f"{NAME} on agent {self.agent_id}: the machine answered {type(value).__name__}, not a response"
            )
        return value
