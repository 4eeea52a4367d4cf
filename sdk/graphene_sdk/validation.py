"""The rules every door applies to a JSON document, shared by the server, graphenectl and the SDK.

One set of rules, so that the REST API, the Studio, graphenectl and a pipeline's ``Client``
refuse the same things with the same reasons:

* **Values PostgreSQL can store**: no NUL character (``\\u0000``) and no lone surrogate
  (``\\ud800``, half of a UTF-16 pair: not Unicode text) in any string, keys included; no
  number JSON cannot carry (``1e400`` parses as infinity); only JSON types.
* **Bounded nesting**: at most ``max_depth`` levels of objects and arrays (``MAX_DEPTH``
  unless the caller passes its own; the server's is ``GRAPHENE_API_MAX_JSON_DEPTH``).
  ``text_too_deep`` answers for a document still in its JSON text, before a parser recurses
  into it.
* **Strict run inputs**: a value has the JSON type its input declares: ``true`` is not an
  integer, ``"1"`` is not an integer and ``1.5`` is not one either (``1.0`` is not: pydantic's
  strict mode and this module agree); a string is an integer only where the input's schema
  says so (``int | str``). Inputs the pipeline does not declare are refused unless its model
  allows extra fields: a misspelt input must not run with its default.

The server validates a start with ``validate_inputs`` (the pipeline's pydantic model, strict);
graphenectl, which only has the pipeline's JSON Schema, with ``schema_problems`` (the same
rules over the schema). Problems are reported by path, ``a.b.0.c``, every one at once.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # pydantic is imported by the functions that need it: the Client's check does not
    from pydantic import BaseModel, ValidationError

__all__ = [
    "DNS_LABEL",
    "DNS_LABEL_RULE",
    "MAX_DEPTH",
    "Problems",
    "dns_label_problem",
    "json_problems",
    "resolve_schema",
    "schema_problems",
    "text_problem",
    "text_too_deep",
    "unknown_inputs",
    "validate_inputs",
]

# The default bound on nesting: real documents (Kubernetes manifests, pipeline inputs) stay
# far below it; PostgreSQL's and Python's parsers recurse, so a bound keeps them safe.
MAX_DEPTH = 64

Problems = dict[str, list[str]]
M = TypeVar("M", bound="BaseModel")

_SURROGATE = re.compile("[\ud800-\udfff]")
# A JSON string (escapes included) or a bracket, in a document's text: strings are skipped so
# that brackets inside them do not count.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_OPEN = frozenset(b"[{")

# A name that is also a DNS label (RFC 1123, as Kubernetes names namespaces and service
# accounts): it can go into a host name, a label value, a file name or a URL as it is.
DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
DNS_LABEL_RULE = "1-63 lowercase letters, digits or '-', starting and ending with a letter or digit"


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored as text, or None."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which cannot be stored: remove it or encode the data (e.g. base64)"
    found = _SURROGATE.search(text)
    if found is not None:
        return (
            f"contains a lone surrogate (\\u{ord(found.group()):04x}), which is not Unicode text: "
            "send UTF-8 text (encode binary data, e.g. base64)"
        )
    return None


def dns_label_problem(name: object) -> str | None:
    """Why ``name`` is not a DNS label (a namespace's or a service account's name), or None."""
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if not DNS_LABEL.fullmatch(name):
        shown = json.dumps(name[:70])  # escaped as JSON writes it: a NUL shows as \u0000
        return f"{shown} is not a valid name: {DNS_LABEL_RULE}"
    return None


def _show(key: str) -> str:
    """A key as a path names it: characters that cannot be shown are escaped (``\\u0000``)."""
    if text_problem(key) is None:
        return key
    return json.dumps(key)[1:-1]


def _join(path: str, part: str | int) -> str:
    return f"{path}.{part}" if path else str(part)


def json_problems(value: Any, *, path: str = "", max_depth: int = MAX_DEPTH, limit: int = 20) -> Problems:
    """What in ``value`` a door refuses, by path (``path`` is the value's own; ``""`` for a
    whole body, reported as ``(body)``). Walks without recursion, so any depth is safe; at most
    ``limit`` paths are reported."""
    problems: Problems = {}

    def add(where: str, message: str) -> None:
        problems.setdefault(where or "(body)", []).append(message)

    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack and len(problems) < limit:
        item, where, level = stack.pop()
        if item is None or isinstance(item, bool | int):
            continue
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                add(where, problem)
        elif isinstance(item, float):
            if not math.isfinite(item):
                add(where, f"is {item}, which JSON cannot carry: numbers must be finite (at most about 1.8e308)")
        elif isinstance(item, dict | list):
            if level >= max_depth:
                add(where, f"is nested deeper than {max_depth} levels of objects and arrays")
                continue
            if isinstance(item, dict):
                children: list[tuple[Any, str, int]] = []
                for key, child in item.items():
                    if not isinstance(key, str):
                        add(where, f"has the key {key!r}; JSON object keys are strings")
                        continue
                    at = _join(where, _show(key))
                    problem = text_problem(key)
                    if problem is not None:
                        add(at, f"the key {problem}")
                    children.append((child, at, level + 1))
                stack.extend(reversed(children))
            else:
                stack.extend((child, _join(where, i), level + 1) for i, child in reversed(list(enumerate(item))))
        else:
            add(where, f"is a {type(item).__name__}, which is not a JSON value")
    return problems


def text_too_deep(text: bytes | str, max_depth: int = MAX_DEPTH) -> bool:
    """Whether a JSON document's text nests objects and arrays deeper than ``max_depth``,
    found without parsing it (a parser would recurse once per level)."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return False
    depth = 0
    for token in _TOKEN.finditer(raw):
        first = token.group()[0]
        if first in _OPEN:
            depth += 1
            if depth > max_depth:
                return True
        elif first != 0x22:  # a closing bracket (strings are skipped)
            depth -= 1
    return False


# --- run inputs ------------------------------------------------------------------------------


def resolve_schema(schema: Any, root: Mapping[str, Any]) -> dict[str, Any]:
    """Follow ``$ref`` (pydantic puts nested models under ``$defs``); merge a lone ``allOf``."""
    for _ in range(20):
        if not isinstance(schema, dict):
            return {}
        if "$ref" in schema:
            ref = str(schema["$ref"])
            target: Any = root
            for part in ref.removeprefix("#/").split("/") if ref.startswith("#/") else []:
                target = target.get(part, {}) if isinstance(target, dict) else {}
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **rest} if isinstance(target, dict) else rest
        elif isinstance(schema.get("allOf"), list) and len(schema["allOf"]) == 1:
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            schema = {**resolve_schema(schema["allOf"][0], root), **rest}
        else:
            return schema
    return schema if isinstance(schema, dict) else {}


def _allows_extra(node: Mapping[str, Any]) -> bool:
    extra = node.get("additionalProperties")
    return extra is True or isinstance(extra, dict)


def unknown_inputs(schema: Mapping[str, Any], document: Any) -> Problems:
    """Fields of ``document`` the schema does not declare (where it allows no others), by path."""
    problems: Problems = {}
    stack: list[tuple[Any, Any, str]] = [(schema, document, "")]
    while stack:
        node_schema, value, prefix = stack.pop()
        node = resolve_schema(node_schema, schema)
        if not isinstance(value, dict) or node.get("type") not in (None, "object") or _allows_extra(node):
            continue
        props = node.get("properties")
        if not isinstance(props, dict):
            continue
        for key, item in value.items():
            path = f"{prefix}{_show(str(key))}"
            if key not in props:
                problems.setdefault(path, []).append(f"unknown input (known here: {', '.join(props) or 'none'})")
            else:
                stack.append((props[key], item, f"{path}."))
    return problems


def _strict_integer(checker: Any, instance: Any) -> bool:
    """JSON Schema counts 1.0 as an integer; pydantic's strict mode does not, nor does Graphene."""
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.cache
def _strict_validator() -> Any:
    """Draft 2020-12 with strict integers (imported late: jsonschema is a slow import)."""
    from jsonschema import Draft202012Validator, validators

    return validators.extend(  # type: ignore[no-untyped-call]  # untyped in types-jsonschema
        Draft202012Validator,
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _strict_integer),
    )


@functools.cache
def _model_validator(model: type[BaseModel]) -> Any:
    from graphene_sdk._pipeline import _model_schema

    return _strict_validator()(_model_schema(model))


def _schema_rules(validator: Any, schema: Mapping[str, Any], document: dict[str, Any]) -> Problems:
    """The schema's own rules (with strict types) and undeclared inputs, by path."""
    problems: Problems = {}
    for error in sorted(validator.iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path]):
        path = ".".join(str(p) for p in error.absolute_path)
        if error.validator == "required" and isinstance(error.instance, dict):
            for name in error.validator_value:
                if name not in error.instance:
                    where = f"{path}.{name}" if path else str(name)
                    problems.setdefault(where, []).append("required (it has no default)")
            continue
        problems.setdefault(path or "(inputs)", []).append(error.message)
    for path, messages in unknown_inputs(schema, document).items():
        problems.setdefault(path, []).extend(messages)
    return problems


def schema_problems(schema: Mapping[str, Any], document: Any, *, max_depth: int = MAX_DEPTH) -> Problems:
    """Every problem with run inputs ``document`` against a pipeline's input JSON Schema, by
    path (``(inputs)`` for the object itself): values a door refuses, undeclared inputs, and
    the schema's own rules with strict types. What graphenectl checks before it sends a start;
    the server checks the same, and its pipeline's model on top (``validate_inputs``)."""
    if not isinstance(document, dict):
        return {"(inputs)": ["must be a JSON object"]}
    problems = json_problems(document, max_depth=max_depth)
    if problems:
        return problems
    return _schema_rules(_strict_validator()(dict(schema)), schema, document)


def _refusal(model: type[BaseModel], problems: Problems, document: Any) -> ValidationError:
    """Problems found outside pydantic, as the ``ValidationError`` a model would raise."""
    from pydantic import ValidationError
    from pydantic_core import PydanticCustomError

    line_errors: list[Any] = []
    for path, messages in problems.items():
        loc = () if path in ("(body)", "(inputs)") else tuple(path.split("."))
        for message in messages:
            line_errors.append(
                {
                    "type": PydanticCustomError("graphene_refused", "{message}", {"message": message}),
                    "loc": loc,
                    "input": document,
                }
            )
    return ValidationError.from_exception_data(model.__name__, line_errors)


def validate_inputs(model: type[M], document: Any, *, max_depth: int = MAX_DEPTH) -> M:
    """``document`` (run inputs as JSON values) as an instance of the pipeline's input model;
    raises ``pydantic.ValidationError`` naming every problem's path.

    The rules of ``schema_problems`` over the model's JSON Schema (what graphenectl checks), and
    the model itself in pydantic's strict mode (its own validators, formats such as date-time):
    an input graphenectl accepts is refused here only for what its schema cannot say."""
    from pydantic import ValidationError

    from graphene_sdk._pipeline import _model_schema

    if not isinstance(document, dict):
        raise _refusal(model, {"(inputs)": ["must be a JSON object"]}, document)
    problems = json_problems(document, max_depth=max_depth)
    if problems:
        raise _refusal(model, problems, document)
    instance: M | None = None
    try:
        # JSON mode: strict about JSON's own types, while a date-time, a UUID or an enum's
        # value still arrive as the strings JSON writes them as.
        instance = model.model_validate_json(json.dumps(document, allow_nan=False), strict=True)
    except ValidationError as exc:
        for error in exc.errors():
            problems.setdefault(".".join(str(p) for p in error["loc"]) or "(inputs)", []).append(error["msg"])
    for path, messages in _schema_rules(_model_validator(model), _model_schema(model), document).items():
        if path not in problems:  # pydantic's words where both object to the same value
            problems[path] = messages
    if problems or instance is None:
        raise _refusal(model, problems or {"(inputs)": ["refused"]}, document)
    return instance
