"""A small, typed client for Graphene's REST API (standard library only).

client = Client("http://127.0.0.1:8000", token="...")
run = client.start(integration, Inputs(branch="main"))   # checked by mypy
info = run.wait(timeout=600)
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from graphene_sdk._errors import ClientError
from graphene_sdk._pipeline import InputT, OutputT, Pipeline

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out"})
R = TypeVar("R")


@dataclass(frozen=True)
class RunInfo:
    """A run as the server reports it."""

    id: str
    pipeline: str
    status: str
    inputs: dict[str, Any]
    outputs: Any
    error: str
    raw: dict[str, Any]

    @property
    def done(self) -> bool:
        return self.status in TERMINAL


class Client:
    """Start, inspect, wait for, cancel and resume runs. Token from the argument or GRAPHENE_TOKEN."""

    def __init__(self, server: str | None = None, *, token: str | None = None, timeout: float = 30.0) -> None:
        server = server or os.environ.get("GRAPHENE_SERVER", "")
        if not server:
            raise ValueError("pass the server URL or set GRAPHENE_SERVER")
        self.server = server.rstrip("/")
        self.token = token or os.environ.get("GRAPHENE_TOKEN", "")
        self.timeout = timeout

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.server}{path}", data=data, method=method)  # noqa: S310
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Token {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                payload = response.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                err = json.loads(raw)
            except ValueError:
                err = {"detail": raw.decode(errors="replace")[:500]}
            raise ClientError(
                f"{method} {path}: {exc.code} {err.get('detail', '')}".strip(),
                status=exc.code,
                code=str(err.get("error", "")),
                fields=err.get("fields") or {},
            ) from None
        except urllib.error.URLError as exc:
            raise ClientError(f"{method} {path}: cannot reach {self.server}: {exc.reason}", status=0) from None
        return json.loads(payload) if payload else None

    def start(self, pipeline: Pipeline[InputT, OutputT], inputs: InputT) -> RunHandle[OutputT]:
        """Start a run of ``pipeline`` with typed ``inputs``; the server validates them again."""
        if not isinstance(inputs, pipeline.inputs):
            raise TypeError(f"{pipeline.name} takes {pipeline.inputs.__name__}, not {type(inputs).__name__}")
        body = {"inputs": inputs.model_dump(mode="json")}
        data = self._request("POST", f"/api/v1/pipelines/{urllib.parse.quote(pipeline.name)}/runs/", body)
        return RunHandle(self, data["id"], pipeline.output)

    def start_by_name(self, name: str, inputs: dict[str, Any]) -> RunHandle[Any]:
        data = self._request("POST", f"/api/v1/pipelines/{urllib.parse.quote(name)}/runs/", {"inputs": inputs})
        return RunHandle(self, data["id"], None)

    def get(self, run_id: str) -> RunInfo:
        data = self._request("GET", f"/api/v1/runs/{run_id}/")
        return RunInfo(
            id=data["id"],
            pipeline=data["pipeline"],
            status=data["status"],
            inputs=data["inputs"],
            outputs=data["outputs"],
            error=data["error"],
            raw=data,
        )

    def cancel(self, run_id: str) -> RunInfo:
        self._request("POST", f"/api/v1/runs/{run_id}/cancel/")
        return self.get(run_id)

    def resume(self, run_id: str) -> RunInfo:
        self._request("POST", f"/api/v1/runs/{run_id}/resume/")
        return self.get(run_id)

    def wait(self, run_id: str, *, timeout: float = 600.0) -> RunInfo:
        """Poll until the run ends (or raise ``TimeoutError``)."""
        deadline = time.monotonic() + timeout
        delay = 0.1
        while True:
            info = self.get(run_id)
            if info.done:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} still {info.status} after {timeout}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)


class RunHandle(Generic[R]):
    """A started run; ``result()`` returns the pipeline's output model."""

    def __init__(self, client: Client, run_id: str, output: type[BaseModel] | None) -> None:
        self.client = client
        self.id = run_id
        self._output = output

    def __repr__(self) -> str:
        return f"RunHandle({self.id})"

    def get(self) -> RunInfo:
        return self.client.get(self.id)

    def wait(self, *, timeout: float = 600.0) -> RunInfo:
        return self.client.wait(self.id, timeout=timeout)

    def cancel(self) -> RunInfo:
        return self.client.cancel(self.id)

    def result(self, *, timeout: float = 600.0) -> R:
        """Wait for the run; its output (typed) if it succeeded, else ``ClientError``."""
        info = self.wait(timeout=timeout)
        if info.status != "succeeded":
            raise ClientError(f"run {self.id} {info.status}: {info.error}", status=200, code=info.status)
        if self._output is None:
            outputs: R = info.outputs
            return outputs
        return self._output.model_validate(info.outputs)  # type: ignore[return-value]
