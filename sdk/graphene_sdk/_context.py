"""What a pipeline sees: ``Context`` and ``Resource`` handles.

Both delegate to a runtime: the Graphene engine when a worker executes a run (journaled,
replayable), or the in-memory runtime of ``graphene_sdk.testing``. Pipeline code is the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Literal, Protocol, TypeVar

from graphene_sdk._errors import ResourceFailed

T = TypeVar("T")
Guarantee = Literal["at_least_once", "at_most_once"]


class Runtime(Protocol):
    """The engine side of a Context (not part of the author's API)."""

    run_id: str

    def declare(
        self, kind: str, name: str, spec: Mapping[str, Any], labels: Mapping[str, str], parent: str | None
    ) -> str: ...

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


class Resource:
    """A handle to a declared record. Returned at once; the record converges in parallel."""

    __slots__ = ("_runtime", "id", "kind", "name")

    def __init__(self, runtime: Runtime, record_id: str, kind: str, name: str) -> None:
        self._runtime = runtime
        self.id = record_id
        self.kind = kind
        self.name = name

    def __repr__(self) -> str:
        return f"Resource({self.kind}/{self.name}, id={self.id})"

    def ready(self) -> dict[str, Any]:
        """The record's outputs once it is ready; raises ``ResourceFailed`` if it cannot be.

        While the record is still converging the run suspends (its worker is released) and
        continues from here when the record changes.
        """
        value, error = self._runtime.ready(self.id, f"{self.kind}/{self.name}")
        if error is not None:
            raise error
        assert value is not None
        return value

    def try_ready(self) -> tuple[dict[str, Any] | None, ResourceFailed | None]:
        """Like ``ready()`` but returns ``(outputs, None)`` or ``(None, error)``."""
        return self._runtime.ready(self.id, f"{self.kind}/{self.name}")

    def delete(self) -> None:
        """Delete this record and its subtree now (children first), before the run ends."""
        self._runtime.delete(self.id, f"{self.kind}/{self.name}")


def _seconds(value: timedelta | float | None, what: str) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        raise ValueError(f"{what} must not be negative")
    return seconds


class Context:
    """The run's handle to Graphene: declarations, steps, timers and the run's log."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    @property
    def run_id(self) -> str:
        return self._runtime.run_id

    def log(self, message: str, *, level: str = "info") -> None:
        """Write a line to the run's log (replay does not write it again)."""
        self._runtime.log(str(message), level)

    def declare(
        self,
        kind: str,
        name: str,
        spec: Mapping[str, Any] | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        parent: Resource | None = None,
    ) -> Resource:
        """Declare a record of ``kind`` owned by this run (or by ``parent``); returns at once.

        Resource libraries (``graphene_sdk.libs``) are built on this call.
        """
        if parent is not None and not isinstance(parent, Resource):
            raise TypeError("parent must be a Resource declared by this run")
        record_id = self._runtime.declare(
            kind, name, dict(spec or {}), dict(labels or {}), parent.id if parent is not None else None
        )
        return Resource(self._runtime, record_id, kind, name)

    def step(
        self,
        name: str,
        fn: Callable[..., T],
        *args: Any,
        guarantee: Guarantee = "at_least_once",
        timeout: timedelta | float | None = None,
        retries: int = 0,
        **kwargs: Any,
    ) -> T:
        """Run ``fn(*args, **kwargs)`` as a checkpointed step and return its (JSON) result.

        At-least-once steps run again after a crash mid-step; at-most-once steps raise
        ``OutcomeUnknown`` instead. A completed step is never run again: replay returns the
        journaled result. ``retries`` re-runs a failing step with backoff before it fails.
        """
        if guarantee not in ("at_least_once", "at_most_once"):
            raise ValueError("guarantee must be 'at_least_once' or 'at_most_once'")
        if retries < 0:
            raise ValueError("retries must not be negative")
        seconds = _seconds(timeout, "timeout")
        result: T = self._runtime.step(name, fn, args, kwargs, guarantee, seconds, retries)
        return result

    def sleep(self, duration: timedelta | float) -> None:
        """A durable timer: the run suspends and a worker resumes it when the time has come."""
        seconds = _seconds(duration, "duration")
        assert seconds is not None
        self._runtime.sleep(seconds)
