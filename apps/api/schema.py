"""The OpenAPI schema is the API's contract (``/api/schema/``, browsable at ``/api/docs/``).

What every operation shares is declared here once: the error answers and their shape
(``Error``: ``{error, detail, fields}``, as ``apps/api/errors.py`` makes them), added to every
operation by a drf-spectacular postprocessing hook, and the query parameters several lists
take (label selectors, booleans, date-times), each with the pattern, enum or bounds the server
enforces (``apps/api/params.py``). ``tests/api/test_schema_contract.py`` holds the server to
it with schemathesis.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema as _AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter

ERROR_COMPONENT = "Error"

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Every error answer of the API (docs/api.md, 'One error shape').",
    "properties": {
        "error": {"type": "string", "description": "a stable code, e.g. validation_failed, not_found, conflict"},
        "detail": {"type": "string", "description": "one sentence that says what to do"},
        "fields": {
            "type": "object",
            "description": "the path of each refused part (a body field, ?param, or id) to its messages",
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
        },
    },
    "required": ["error", "detail", "fields"],
}

_WHY = {
    "400": "refused input: a field, query parameter or id is named in `fields`",
    "401": "no token, or an unknown one",
    "403": "the token's user may not do this",
    "404": "no such thing (or nothing this user may see)",
    "409": "the current state forbids it",
    "413": "the body is larger than the server takes",
    "415": "a body of a media type this operation does not take",
    "422": "well formed, but it contradicts what was done before (an idempotency key reused with other inputs)",
}
# Every operation may answer these: input is checked (query strings, ids in the path), a token is
# needed, permissions apply and a path names something that may not exist.
_EVERY = ("400", "401", "403", "404")
# And every operation that takes a body or changes state these.
_WRITES = ("409", "413", "415")
_METHODS = {"get", "put", "post", "patch", "delete", "head", "options"}


def error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: the ``Error`` component, and the error answers on
    every operation (a declared response without a body, such as ``409: None``, gets the shape)."""
    result.setdefault("components", {}).setdefault("schemas", {})[ERROR_COMPONENT] = ERROR_SCHEMA
    ref = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            if method not in _METHODS:
                continue
            responses = operation.setdefault("responses", {})
            codes = _EVERY + (_WRITES if method != "get" else ())
            for code in (*codes, *[c for c in responses if c.startswith("4") and c not in codes]):
                declared = responses.get(code)
                if declared is None or "content" not in declared:
                    responses[code] = {
                        "description": (declared or {}).get("description") or _WHY.get(code, "refused"),
                        "content": {"application/json": {"schema": ref}},
                    }
    return result


# --- shared query parameters ------------------------------------------------------------------

# One ``key=value`` pair, or several joined by commas (``env=prod,team=a``): what
# ``apps.records.selectors.parse_label_selector`` takes.
LABEL_SELECTOR_PATTERN = r"^[^=,]+=[^,]*(,[^=,]+=[^,]*)*$"


def label_param(description: str = "k=v (repeatable, or comma-separated; all must match)") -> OpenApiParameter:
    return OpenApiParameter(
        "label",
        {"type": "array", "items": {"type": "string", "pattern": LABEL_SELECTOR_PATTERN}},
        description=description,
        explode=True,
    )


def bool_param(name: str, description: str) -> OpenApiParameter:
    """A boolean query parameter: ``true``/``false`` (also ``1``/``0``, ``yes``/``no``)."""
    return OpenApiParameter(name, OpenApiTypes.BOOL, description=description)


def datetime_param(name: str, description: str = "ISO 8601 date-time (naive means UTC)") -> OpenApiParameter:
    return OpenApiParameter(name, OpenApiTypes.DATETIME, description=description)


def uuid_param(name: str, description: str) -> OpenApiParameter:
    return OpenApiParameter(name, OpenApiTypes.UUID, description=description)


def int_param(name: str, lo: int, hi: int, description: str) -> OpenApiParameter:
    return OpenApiParameter(
        name, {"type": "integer", "minimum": lo, "maximum": hi}, description=f"{description} ({lo} to {hi})"
    )


def enum_list_param(name: str, values: list[str], description: str) -> OpenApiParameter:
    """A comma-separated list of values from ``values`` (``?status=failed,cancelled``)."""
    return OpenApiParameter(
        name,
        {"type": "array", "items": {"type": "string", "enum": values}},
        description=description,
        explode=False,
    )


class AutoSchema(_AutoSchema):
    """drf-spectacular's AutoSchema, told what the views know: the ids in a path are UUIDs
    (``DoorChecks.path_ids``: a malformed one is a 400), other path parameters follow the
    patterns in ``path_patterns`` (a view attribute: URL keyword to a regex), and an input
    serializer that refuses fields it does not know (``refuses_unknown_fields = True``, so that
    a typo is not dropped silently) says so: ``additionalProperties: false``."""

    def _map_basic_serializer(self, serializer: Any, direction: str) -> dict[str, Any]:
        schema: dict[str, Any] = super()._map_basic_serializer(serializer, direction)
        if direction == "request" and getattr(serializer, "refuses_unknown_fields", False):
            schema["additionalProperties"] = False
        return schema

    def _resolve_path_parameters(self, variables: list[str]) -> list[dict[str, Any]]:
        parameters: list[dict[str, Any]] = super()._resolve_path_parameters(variables)
        ids = getattr(self.view, "path_ids", {})
        patterns = getattr(self.view, "path_patterns", {})
        for parameter in parameters:
            name = parameter["name"]
            if name in ids or (name == "id" and "pk" in ids):
                parameter["schema"] = {"type": "string", "format": "uuid"}
            elif name in patterns:
                parameter["schema"] = {"type": "string", "pattern": patterns[name]}
        return parameters
