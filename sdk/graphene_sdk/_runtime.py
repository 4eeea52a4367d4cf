"""The engine side of a Context: the protocol a runtime implements (the Graphene engine, or
the testing kit's in-memory world). Not part of the author's API."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from graphene_sdk._errors import ResourceFailed
from graphene_sdk._remote import (
    RemoteCall,
)

if TYPE_CHECKING:
    from graphene_sdk._pipeline import Pipeline


Guarantee = Literal["at_least_once", "at_most_once"]

DriftPolicy = Literal["heal", "report"]


class Runtime(Protocol):
    """The engine side of a Context (not part of the author's API)."""

    run_id: str

    def declare(
        self,
        kind: str,
        name: str,
        spec: Mapping[str, Any],
        labels: Mapping[str, str],
        parent: str | None,
        children: Sequence[str],
        drift: Mapping[str, Any] | None = None,
        protect: bool = False,
    ) -> str: ...

    def attach(self, record_id: str) -> tuple[str, str]: ...

    def to_stand(self, record_id: str, label: str, keep_for: float | None, replace: bool = False) -> None: ...

    def run_children(
        self, pipeline: Pipeline[Any, Any], inputs: Sequence[dict[str, Any]], concurrency: int
    ) -> list[Any]: ...

    def agent(self, name: str, labels: Mapping[str, str], needs: list[dict[str, Any]]) -> str: ...

    def agent_install(self, record_id: str, form: Literal["env", "script"]) -> str: ...

    def agent_via_ssh(self, name: str, labels: Mapping[str, str], target: Mapping[str, Any]) -> str: ...

    def attach_agent(self, name_or_id: str, needs: list[dict[str, Any]]) -> dict[str, Any]: ...

    def select_agents(self, labels: Mapping[str, str], needs: list[dict[str, Any]]) -> list[dict[str, Any]]: ...

    def publish_capability(
        self, record_id: str, label: str, name: str, version: str, labels: Mapping[str, str]
    ) -> None: ...

    def agent_exec(
        self,
        record_id: str,
        label: str,
        argv: Sequence[str],
        env: Mapping[str, str | Mapping[str, str]],
        cwd: str | None,
        timeout: float | None,
        guarantee: Guarantee,
    ) -> dict[str, Any]: ...

    # put_file/get_file/call are commands like exec: stored, journaled by command id, awaited.
    def agent_put_file(self, record_id: str, label: str, path: str, data: bytes, mode: int) -> dict[str, Any]: ...

    def agent_get_file(self, record_id: str, label: str, path: str, max_bytes: int) -> bytes: ...

    def agent_call(
        self, record_id: str, label: str, call: RemoteCall, timeout: float | None, guarantee: Guarantee
    ) -> Any: ...

    def ready(self, record_id: str, label: str) -> tuple[dict[str, Any] | None, ResourceFailed | None]: ...

    def delete(self, record_id: str, label: str) -> None: ...

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        guarantee: Guarantee,
        timeout: float | None,
        retries: int,
    ) -> Any: ...

    def sleep(self, seconds: float) -> None: ...

    def log(self, message: str, level: str) -> None: ...

    # Artifacts: publish stores the bytes and journals a reference; read is not journaled
    # (an artifact never changes, so a replay reads the same bytes).
    def publish_artifact(
        self, name: str, data: bytes | Path, content_type: str | None, keep_for: float | None, labels: Mapping[str, str]
    ) -> dict[str, Any]: ...

    def attach_artifact(self, name_or_id: str, pipeline: str | None) -> dict[str, Any]: ...

    def read_artifact(self, artifact_id: str) -> bytes: ...
