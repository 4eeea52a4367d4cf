"""The door's checks, for every way in: REST, websockets, the Studio, services called by the engine.

The rules themselves are the SDK's (``graphene_sdk.validation``), so that graphenectl and a
pipeline's ``Client`` refuse what the server refuses; this module applies them with the
server's limits and raises ``ValidationFailed`` (a 400 in the API's error shape) naming the
path of what was refused: ``inputs.label``, ``spec.env.FOO``, ``?label``, ``owner``.

Interface code must check what it takes in here (the REST parsers and middleware do it for
every body and query string); domain code may (services check what reaches them by other
ways: the engine, the Studio's forms).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from django.conf import settings
from graphene_sdk import validation as rules
from pydantic import BaseModel, ValidationError

from apps.core.errors import GrapheneError, ValidationFailed

M = TypeVar("M", bound=BaseModel)
_SURROGATES = re.compile("[\ud800-\udfff]")
_INTEGER = re.compile("-?[0-9]+")
# Documents nested up to this deep are parsed (and then refused by path if over the bound);
# deeper ones are refused from their text: Python's parser recurses once per level.
PARSE_DEPTH = 128


class TooLarge(GrapheneError):
    """A body over the size bound (``GRAPHENE_API_MAX_BODY_BYTES``)."""

    status_code = 413
    code = "too_large"


class TooDeep(ValidationFailed):
    """A document nested deeper than ``GRAPHENE_API_MAX_JSON_DEPTH``."""

    code = "too_deep"


def too_large(size: int | None = None) -> TooLarge:
    """The 413 for a body over the bound (``size``: its declared length, when known)."""
    limit = max_body_bytes()
    what = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return TooLarge(
        f"the body has {what}; the API takes at most {limit} (GRAPHENE_API_MAX_BODY_BYTES): "
        "send large data as an artifact (POST /api/v1/artifacts/)"
    )


def max_depth() -> int:
    """How many levels of objects and arrays a JSON document may nest."""
    return int(settings.GRAPHENE_API_MAX_JSON_DEPTH)


def max_body_bytes() -> int:
    """The largest request body parsed into memory (JSON bodies; not artifact uploads)."""
    return int(settings.GRAPHENE_API_MAX_BODY_BYTES)


def _escaped(text: str) -> str:
    """``text`` with what cannot be shown escaped, as JSON writes it (``\\u0000``)."""
    return json.dumps(text)[1:-1]


def _refuse(problems: Mapping[str, list[str]], what: str) -> ValidationFailed:
    summary = "; ".join(f"{path}: {' '.join(messages)}" for path, messages in problems.items())
    depth = any("nested deeper" in m for messages in problems.values() for m in messages)
    cls = TooDeep if depth else ValidationFailed
    return cls(f"{what} is refused: {summary}", fields=dict(problems))


def check_json(value: Any, *, path: str = "", what: str = "the request") -> Any:
    """``value`` if every string in it (keys too) can be stored and it nests within the bound;
    else ``ValidationFailed`` naming each path (``spec.env.FOO``)."""
    problems = rules.json_problems(value, path=path, max_depth=max_depth())
    if problems:
        raise _refuse(problems, what)
    return value


def check_text(value: str, *, field: str) -> str:
    """``value`` if it can be stored as text; else ``ValidationFailed`` naming ``field``."""
    problem = rules.text_problem(value)
    if problem is not None:
        raise ValidationFailed(f"{field} {problem}", fields={field: [problem]})
    return value


def storable_text(text: str) -> str:
    """``text`` with what PostgreSQL cannot store (NUL, lone surrogates) replaced by U+FFFD: for
    what Graphene records as it came (a program's output), not for input it refuses."""
    if rules.text_problem(text) is None:
        return text
    return _SURROGATES.sub("\ufffd", text.replace("\x00", "\ufffd"))


def check_json_text(raw: bytes | str, *, what: str = "the body") -> None:
    """Refuse a JSON document's text that nests so deep a parser would recurse dangerously,
    before it is parsed. Up to ``PARSE_DEPTH`` levels it is parsed, and ``check_json`` names
    the path where it goes deeper than the bound."""
    limit = max_depth()
    if rules.text_too_deep(raw, max(limit, PARSE_DEPTH)):
        raise TooDeep(
            f"{what} nests objects and arrays deeper than {limit} levels (GRAPHENE_API_MAX_JSON_DEPTH)",
            fields={"(body)": [f"nested deeper than {limit} levels"]},
        )


def check_params(params: Any, *, prefix: str = "?") -> None:
    """Query parameters (a ``QueryDict``, or a mapping of names to a value or a list of them):
    every name and value must be storable text; ``ValidationFailed`` naming ``?name`` (form
    fields: ``prefix=""``, named as they are)."""
    problems: dict[str, list[str]] = {}
    items: Iterable[tuple[str, Any]] = params.lists() if hasattr(params, "lists") else params.items()
    for name, values in items:
        problem = rules.text_problem(name)
        shown = f"{prefix}{_escaped(name) if problem else name}"
        if problem is not None:
            problems.setdefault(shown, []).append(f"the name {problem}")
        for value in values if isinstance(values, list | tuple) else [values]:
            problem = rules.text_problem(str(value))
            if problem is not None:
                problems.setdefault(shown, []).append(problem)
    if problems:
        raise _refuse(problems, "the query" if prefix else "the form")


def parse_uuid(raw: Any, *, field: str, noun: str = "record") -> uuid.UUID:
    """An id given as ``field`` (a path segment, a body field or a query parameter); a
    malformed one is a 400 naming the field, not a 404: nothing could ever have that id."""
    if isinstance(raw, uuid.UUID):
        return raw
    try:
        if not isinstance(raw, str):
            raise ValueError
        return uuid.UUID(raw)
    except ValueError:
        shown = _escaped(raw[:60]) if isinstance(raw, str) else repr(raw)
        raise ValidationFailed(
            f"{field}='{shown}' is not a {noun} id: {noun} ids are UUIDs (e.g. 3f2b1c9e-...)",
            fields={field: [f"not a {noun} id (a UUID)"]},
        ) from None


def parse_int(raw: str | None, *, field: str, default: int, lo: int, hi: int) -> int:
    """An integer given as text within [lo, hi], ``default`` if absent; a field error otherwise."""
    if raw is None or raw == "":
        return default
    text = raw.strip()
    if not _INTEGER.fullmatch(text):
        shown = _escaped(text[:40])
        raise ValidationFailed(f"{field}='{shown}' is not an integer", fields={field: ["not an integer"]})
    value = int(text) if len(text) <= 30 else (hi + 1 if not text.startswith("-") else lo - 1)
    if not lo <= value <= hi:
        raise ValidationFailed(f"{field} must be between {lo} and {hi}", fields={field: [f"between {lo} and {hi}"]})
    return value


def check_inputs(model: type[M], inputs: Any, *, name: str, path: str = "inputs") -> M:
    """Run inputs as an instance of the pipeline's model, by the SDK's rules (strict types,
    storable values, no undeclared inputs); ``ValidationFailed`` by path (``inputs.label``)."""
    try:
        return rules.validate_inputs(model, inputs, max_depth=max_depth())
    except ValidationError as exc:
        fields: dict[str, list[str]] = {}
        for error in exc.errors():
            where = ".".join(str(p) for p in (path, *error["loc"]))
            fields.setdefault(where, []).append(error["msg"])
        summary = "; ".join(f"{k}: {', '.join(v)}" for k, v in fields.items())
        raise ValidationFailed(f"inputs do not match {name}'s schema: {summary}", fields=fields) from None


def check_dns_label(value: Any, *, field: str) -> str:
    """``value`` if it is a DNS label (a namespace's or a service account's name, by the SDK's
    rule); else ``ValidationFailed`` naming ``field`` (``name``, ``?namespace``)."""
    problem = rules.dns_label_problem(value)
    if problem is not None:
        raise ValidationFailed(f"{field}: {problem}", fields={field: [problem]})
    assert isinstance(value, str)
    return value
