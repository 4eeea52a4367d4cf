"""The start-a-run form, generated from a pipeline's input JSON Schema (pydantic's).

Each property becomes a field by its type: text, a whole or decimal number, a yes/no, a choice
among an enum's values, a list (one item a line), a nested model (a fieldset of its own
fields, named ``outer.inner``), anything else JSON. What the form posts is turned back into
typed JSON here; the inputs are then validated by the same service the API calls (the door's
rules of ``apps.core.validation``: strict types, storable values), and its errors
(``inputs.outer.inner``) are shown on the fields they name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from apps.core import validation
from apps.core.errors import ValidationFailed

Schema = dict[str, Any]
MISSING: Any = object()
# How deep nested models are laid out as fieldsets before the rest is a JSON field.
MAX_DEPTH = 4


@dataclass
class InputField:
    name: str  # the dotted path: ``db.host``
    label: str
    kind: str  # string, integer, number, boolean, enum, list, object, json
    required: bool
    default: Any = MISSING
    nullable: bool = False
    description: str = ""
    choices: list[Any] = field(default_factory=list)
    item_kind: str = ""  # for a list: the kind of its items
    children: list[InputField] = field(default_factory=list)
    value: str = ""  # what the form shows (a posted value, or the default)
    errors: list[str] = field(default_factory=list)

    @property
    def html_id(self) -> str:
        return "input-" + self.name.replace(".", "-")

    @property
    def default_text(self) -> str:
        return "" if self.default is MISSING else _text(self.default, self.kind)


def _deref(schema: Schema, root: Schema) -> Schema:
    """Follow a ``$ref`` into ``$defs`` (and a lone ``allOf``, pydantic's way of adding a default)."""
    for _ in range(20):
        if "$ref" in schema:
            target: Any = root
            for part in str(schema["$ref"]).removeprefix("#/").split("/"):
                target = target.get(part, {}) if isinstance(target, dict) else {}
            schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        elif isinstance(schema.get("allOf"), list) and len(schema["allOf"]) == 1:
            schema = {**schema["allOf"][0], **{k: v for k, v in schema.items() if k != "allOf"}}
        else:
            return schema
    return schema


def _kind(schema: Schema, root: Schema) -> tuple[str, Schema, bool]:
    """(kind, the schema that gives it, nullable) of one property."""
    schema = _deref(schema, root)
    options = schema.get("anyOf") or schema.get("oneOf")
    nullable = False
    if isinstance(options, list):
        real = [_deref(o, root) for o in options if _deref(o, root).get("type") != "null"]
        nullable = len(real) < len(options)
        if len(real) != 1:
            return "json", schema, nullable
        schema = {**real[0], **{k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}}
    if "enum" in schema:
        return "enum", schema, nullable
    kind = schema.get("type")
    if kind in ("string", "integer", "number", "boolean"):
        return str(kind), schema, nullable
    if kind == "array":
        items = _deref(schema.get("items") or {}, root)
        item_kind = items.get("type")
        if "enum" in items or item_kind in ("string", "integer", "number"):
            return "list", schema, nullable
        return "json", schema, nullable
    if kind == "object" and isinstance(schema.get("properties"), dict):
        return "object", schema, nullable
    return "json", schema, nullable


def form_fields(schema: Schema, *, root: Schema | None = None, prefix: str = "", depth: int = 0) -> list[InputField]:
    """The fields of an object schema, in its properties' order."""
    root = root if root is not None else schema
    schema = _deref(schema, root)
    required = set(schema.get("required") or [])
    fields: list[InputField] = []
    for name, prop in (schema.get("properties") or {}).items():
        kind, resolved, nullable = _kind(prop, root)
        if kind == "object" and depth >= MAX_DEPTH:
            kind = "json"
        path = f"{prefix}{name}"
        item = InputField(
            name=path,
            label=str(resolved.get("title") or prop.get("title") or name),
            kind=kind,
            required=name in required,
            default=prop.get("default", resolved.get("default", MISSING)),
            nullable=nullable,
            description=str(prop.get("description") or resolved.get("description") or ""),
            choices=list(resolved.get("enum") or []),
        )
        if kind == "list":
            item.item_kind, _, _ = _kind(resolved.get("items") or {}, root)
        if kind == "object":
            item.children = form_fields(resolved, root=root, prefix=f"{path}.", depth=depth + 1)
        item.value = item.default_text
        fields.append(item)
    return fields


def _text(value: Any, kind: str) -> str:
    """A JSON value as the form shows it."""
    if value is None:
        return ""
    if kind == "boolean":
        return "true" if value else "false"
    if kind == "list" and isinstance(value, list):
        return "\n".join(str(v) for v in value)
    if kind in ("json", "object") or isinstance(value, dict | list):
        return json.dumps(value, indent=2)
    return str(value)


class FormError(Exception):
    pass


def _typed(raw: str, kind: str) -> Any:
    if kind == "integer":
        try:
            return int(raw)
        except ValueError:
            raise FormError(f"{raw!r} is not a whole number") from None
    if kind == "number":
        try:
            return float(raw) if any(c in raw for c in ".eE") else int(raw)
        except ValueError:
            raise FormError(f"{raw!r} is not a number") from None
    return raw


def inputs_from_post(fields: list[InputField], post: Any) -> dict[str, Any]:
    """The inputs the form posted, typed by the schema. A field left empty that has a default
    (or is not required) is left out: the server fills its default. Errors go on the fields."""
    inputs: dict[str, Any] = {}
    for item in fields:
        raw = str(post.get(item.name, "")).strip() if item.kind != "boolean" else post.get(item.name, "")
        if item.kind == "object":
            nested = inputs_from_post(item.children, post)
            if nested:
                inputs[item.name.rsplit(".", 1)[-1]] = nested
            continue
        key = item.name.rsplit(".", 1)[-1]
        if item.kind == "boolean":
            item.value = "true" if raw in ("true", "on") else "false"
            inputs[key] = raw in ("true", "on")
            continue
        item.value = raw
        if raw == "":
            if item.nullable and item.default is MISSING:
                inputs[key] = None
            continue  # the default, or the server names what is missing
        try:
            if item.kind == "enum":
                by_text = {str(choice): choice for choice in item.choices}
                if raw not in by_text:
                    raise FormError(f"{raw!r} is not one of {', '.join(by_text)}")
                inputs[key] = by_text[raw]
            elif item.kind == "list":
                inputs[key] = [_typed(line.strip(), item.item_kind) for line in raw.splitlines() if line.strip()]
            elif item.kind == "json":
                try:
                    validation.check_json_text(raw, what="the value")  # before the parser recurses
                    inputs[key] = json.loads(raw)
                except ValidationFailed as exc:
                    raise FormError(exc.detail) from None
                except ValueError as exc:
                    raise FormError(f"not JSON: {exc}") from None
            else:
                inputs[key] = _typed(raw, item.kind)
        except FormError as exc:
            item.errors.append(str(exc))
    return inputs


def show_errors(fields: list[InputField], errors: dict[str, list[str]]) -> list[str]:
    """Put the server's per-field errors (``inputs.db.host``) on the fields; returns those that
    name no field (the form shows them at its top)."""
    by_name = {item.name: item for item in _walk(fields)}
    unplaced: list[str] = []
    for path, messages in errors.items():
        name = path.removeprefix("inputs.").removeprefix("inputs")
        target = by_name.get(name)
        while target is None and "." in name:  # an error inside a list or a JSON value: its field
            name = name.rsplit(".", 1)[0]
            target = by_name.get(name)
        if target is None:
            unplaced.extend(f"{path}: {m}" for m in messages)
        else:
            target.errors.extend(messages)
    return unplaced


def _walk(fields: list[InputField]) -> list[InputField]:
    out: list[InputField] = []
    for item in fields:
        out.append(item)
        out.extend(_walk(item.children))
    return out


def has_errors(fields: list[InputField]) -> bool:
    return any(item.errors for item in _walk(fields))
