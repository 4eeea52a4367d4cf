"""The root of Graphene's domain errors. Services raise these; the API maps them to 4xx."""

from __future__ import annotations

from typing import Any


class GrapheneError(Exception):
    """A refused operation. ``code`` is stable for clients; ``detail`` says what to do."""

    status_code = 400
    code = "invalid"

    def __init__(self, detail: str, *, code: str | None = None, fields: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        self.fields = fields or {}


class NotFound(GrapheneError):
    status_code = 404
    code = "not_found"


class Conflict(GrapheneError):
    status_code = 409
    code = "conflict"


class ValidationFailed(GrapheneError):
    """Input does not match a schema; ``fields`` maps a field path to its messages."""

    code = "validation_failed"
