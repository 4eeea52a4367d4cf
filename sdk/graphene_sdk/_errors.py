"""The SDK's errors. Everything the SDK raises on purpose derives from ``GrapheneError``."""

from __future__ import annotations

from typing import Any


class GrapheneError(Exception):
    """Root of every error raised by graphene_sdk."""


class ResourceFailed(GrapheneError):
    """A declared resource could not be created (or was deleted) — ``Resource.ready()``."""

    def __init__(self, message: str, *, record_id: str = "", phase: str = "") -> None:
        super().__init__(message)
        self.record_id = record_id
        self.phase = phase


class StepFailed(GrapheneError):
    """A checkpointed step raised after its retries; replay raises it again, identically."""

    def __init__(self, message: str, *, step: str, error_type: str) -> None:
        super().__init__(message)
        self.step = step
        self.error_type = error_type


class StepTimeout(StepFailed):
    """A step ran longer than its ``timeout``."""


class RemoteError(GrapheneError):
    """A function run on an agent's machine (``Agent.run``) raised there; replay raises it again.

    ``remote_type`` is the exception's type name on the machine (``"FileNotFoundError"``),
    ``remote_message`` its message and ``remote_traceback`` the traceback printed there.
    """

    def __init__(
        self,
        message: str,
        *,
        function: str,
        remote_type: str,
        remote_message: str,
        remote_traceback: str = "",
        record_id: str = "",
    ) -> None:
        super().__init__(message)
        self.function = function
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        self.record_id = record_id


class OutcomeUnknown(GrapheneError):
    """An at-most-once step was interrupted (crash or cancel): it may or may not have acted.

    Graphene never runs such a step a second time; the pipeline decides what to do.
    """

    def __init__(self, message: str, *, step: str) -> None:
        super().__init__(message)
        self.step = step


class NonDeterminismError(GrapheneError):
    """The program no longer matches its journal: replay refuses to guess."""

    def __init__(self, message: str, *, seq: int, journaled: str, called: str) -> None:
        super().__init__(message)
        self.seq = seq
        self.journaled = journaled
        self.called = called


class RunCancelled(GrapheneError):
    """The run was cancelled while the pipeline was running."""


class ClientError(GrapheneError):
    """A ``Client`` request failed. The server's answer, when there was one, in its error shape:
    ``status`` (HTTP; 0 when the server could not be reached), ``code`` (its ``error``: for
    example ``not_found``, ``validation_failed``, ``conflict``), ``detail`` (its text) and
    ``fields`` (per-field messages, e.g. ``{"inputs.branch": ["..."]}``)."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str = "",
        detail: str = "",
        fields: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.detail = detail or message
        self.fields = fields or {}


class ConfigError(GrapheneError):
    """No server or token could be found (no context, no ``GRAPHENE_SERVER``/``GRAPHENE_TOKEN``),
    a context that does not exist was named, or the contexts file cannot be read. ``hint`` says
    what to run; ``is_usage`` is true when the caller named something wrong."""

    def __init__(self, message: str, *, hint: str | None = None, is_usage: bool = False) -> None:
        super().__init__(message)
        self.hint = hint
        self.is_usage = is_usage


class ChildRunFailed(GrapheneError):
    """A child run started with ``ctx.run``/``ctx.run_all`` did not succeed.

    ``failures`` maps each failed child's run id to why it ended; ``by_input`` maps the
    position of its inputs in the list given to ``run_all`` (0 for ``ctx.run``) to the same.
    """

    def __init__(self, message: str, *, failures: dict[str, str], by_input: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.failures = failures
        self.by_input = by_input or {}


class ConcurrencyLimit(GrapheneError):
    """A start was refused by the pipeline's concurrency policy (``queue`` with ``max_pending``)."""
