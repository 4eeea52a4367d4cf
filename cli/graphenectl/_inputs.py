"""Run inputs checked against the pipeline's input JSON Schema before anything is sent.

``--input k=v`` strings are coerced by the schema's type for ``k`` (``replicas=3`` → 3,
``flag=true`` → true, ``tags=a,b`` or ``tags=["a","b"]`` → a list; ``db.host=x`` sets a
nested field), then
the whole object is validated by the rules the server applies too (``graphene_sdk.validation``:
strict types, values PostgreSQL can store, no undeclared inputs unless the schema allows extra
properties); every problem is reported at once, by field path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from graphene_sdk.validation import resolve_schema as resolve  # the server's reading of $ref and allOf

Schema = dict[str, Any]

_TRUE = {"true", "yes", "y", "on", "1"}
_FALSE = {"false", "no", "n", "off", "0"}


def _options(schema: Schema, root: Schema) -> list[Schema]:
    schema = resolve(schema, root)
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return [o for alt in schema[key] for o in _options(alt, root)]
    return [schema]


def type_names(schema: Schema, root: Schema) -> list[str]:
    names: list[str] = []
    for option in _options(schema, root):
        if "enum" in option or "const" in option:
            names.append("enum")
            continue
        kind = option.get("type")
        for k in kind if isinstance(kind, list) else [kind] if kind else ["any"]:
            if k == "array":
                items = option.get("items")
                inner = "|".join(type_names(items, root)) if isinstance(items, dict) else "any"
                k = f"array[{inner}]"
            if k not in names:
                names.append(str(k))
    return names


def describe_type(schema: Schema, root: Schema) -> str:
    parts = []
    for option in _options(schema, root):
        if "enum" in option:
            parts.append("one of " + ", ".join(json.dumps(v) for v in option["enum"]))
        elif "const" in option:
            parts.append(json.dumps(option["const"]))
        else:
            parts.extend(type_names(option, root))
    out: list[str] = []
    for p in parts:
        if p not in out:
            out.append(p)
    return " | ".join(out) or "any"


def constraints(schema: Schema, root: Schema) -> str:
    s = resolve(schema, root)
    bits = []
    lo = s.get("minimum", s.get("exclusiveMinimum"))
    hi = s.get("maximum", s.get("exclusiveMaximum"))
    if lo is not None or hi is not None:
        left = "" if lo is None else f"{lo} {'<' if 'exclusiveMinimum' in s else '≤'} "
        right = "" if hi is None else f" {'<' if 'exclusiveMaximum' in s else '≤'} {hi}"
        bits.append(f"{left}x{right}")
    if "minLength" in s or "maxLength" in s:
        bits.append(f"length {s.get('minLength', 0)}..{s.get('maxLength', '')}")
    if "minItems" in s or "maxItems" in s:
        bits.append(f"items {s.get('minItems', 0)}..{s.get('maxItems', '')}")
    if "pattern" in s:
        bits.append(f"pattern {s['pattern']}")
    if "format" in s:
        bits.append(f"format {s['format']}")
    return ", ".join(bits)


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    required: bool
    default: Any
    has_default: bool
    description: str
    constraints: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "required": self.required,
            "default": self.default if self.has_default else None,
            "description": self.description,
            "constraints": self.constraints,
        }


def fields(schema: Schema) -> list[Field]:
    """The top-level input fields with types, defaults and descriptions (nested ones as ``a.b``)."""
    out: list[Field] = []

    def walk(obj: Schema, prefix: str, required_parent: bool) -> None:
        obj = resolve(obj, schema)
        required = set(obj.get("required") or [])
        for name, prop in (obj.get("properties") or {}).items():
            p = resolve(prop, schema)
            path = f"{prefix}{name}"
            is_required = required_parent and name in required
            if p.get("type") == "object" and p.get("properties") and "default" not in p:
                walk(p, f"{path}.", is_required)
                continue
            out.append(
                Field(
                    name=path,
                    type=describe_type(prop, schema),
                    required=is_required,
                    default=p.get("default"),
                    has_default="default" in p,
                    description=str(p.get("description") or ""),
                    constraints=constraints(prop, schema),
                )
            )

    walk(schema, "", True)
    return out


def _coerce(raw: str, schema: Schema, root: Schema) -> Any:
    """The JSON value for ``raw`` that the field's schema accepts; raises ValueError with a reason."""
    options = _options(schema, root)
    kinds: list[str] = []
    choices: list[Any] = []
    for option in options:
        if "enum" in option or "const" in option:
            for value in option.get("enum", [option.get("const")]):
                if raw == (value if isinstance(value, str) else json.dumps(value)):
                    return value
                choices.append(value)
            continue
        kind = option.get("type")
        kinds.extend(kind if isinstance(kind, list) else [kind] if kind else ["any"])
    if raw == "null" and "null" in kinds:
        return None
    if "boolean" in kinds and raw.lower() in _TRUE | _FALSE:
        return raw.lower() in _TRUE
    if "integer" in kinds:
        try:
            return int(raw)
        except ValueError:
            pass
    if "number" in kinds:
        try:
            number = float(raw)
        except ValueError:
            pass
        else:
            return int(number) if number.is_integer() and "." not in raw and "e" not in raw.lower() else number
    if {"array", "object"} & set(kinds):
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if (isinstance(value, list) and "array" in kinds) or (isinstance(value, dict) and "object" in kinds):
            return value
        if "array" in kinds and not raw.lstrip().startswith("["):
            # a,b,c for a list of scalars: each item coerced by the items' schema
            array = next(o for o in options if o.get("type") == "array")
            items = array.get("items")
            items = items if isinstance(items, dict) else {}
            return [_coerce(part.strip(), items, root) for part in raw.split(",")] if raw else []
    if "string" in kinds or "any" in kinds:
        if "any" in kinds:
            try:
                return json.loads(raw)
            except ValueError:
                return raw
        return raw
    wanted = list(dict.fromkeys(kinds))
    if choices:
        wanted.append("one of " + ", ".join(c if isinstance(c, str) else json.dumps(c) for c in choices))
    text = " or ".join(wanted)
    if "object" in kinds:
        text += ' (as JSON, e.g. \'{"k": "v"}\')'
    article = "" if text.startswith("one of") else "an " if text[0] in "aeiou" else "a "
    raise ValueError(f"{raw!r} is not {article}{text}")


def _allows_extra(obj: Schema) -> bool:
    extra = obj.get("additionalProperties")
    return extra is True or isinstance(extra, dict)


def build(schema: Schema, base: dict[str, Any], pairs: list[str]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Merge ``k=v`` pairs into ``base`` (from ``--inputs``), coercing by the schema."""
    inputs = json.loads(json.dumps(base))  # a deep copy
    errors: dict[str, list[str]] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            errors.setdefault(pair, []).append("write inputs as name=value")
            continue
        node: Schema = resolve(schema, schema)
        target = inputs
        parts = key.split(".")
        for depth, part in enumerate(parts):
            props = node.get("properties") or {}
            if part not in props and not _allows_extra(node):
                known = ", ".join(props) or "none"
                errors.setdefault(key, []).append(f"unknown input (known here: {known})")
                break
            field_schema = props.get(part, node.get("additionalProperties") if _allows_extra(node) else {})
            field_schema = field_schema if isinstance(field_schema, dict) else {}
            if depth == len(parts) - 1:
                try:
                    target[part] = _coerce(raw, field_schema, schema)
                except ValueError as exc:
                    errors.setdefault(key, []).append(str(exc))
            else:
                child = target.get(part)
                if not isinstance(child, dict):
                    child = target[part] = {}
                target = child
                node = resolve(field_schema, schema)
    return inputs, errors


def validate(schema: Schema, inputs: Any) -> dict[str, list[str]]:
    """Every problem with ``inputs``, by field path (``(inputs)`` for the object itself): the
    SDK's rules (``graphene_sdk.validation``), the very ones the server applies to a start."""
    # Imported here, as jsonschema inside it: only `run start` needs them, and they are slow.
    from graphene_sdk import validation

    return validation.schema_problems(schema, inputs)
