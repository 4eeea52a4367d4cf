"""Secret references: pipelines name secrets, they never hold their values (invariant I7)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from graphene_sdk._artifacts import ArtifactRef

# Letters, digits, '.', '_' and '-', starting and ending with a letter or digit, 1-128 long.
SECRET_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?")
SECRET_NAME_RULE = "1-128 letters, digits, '.', '_' or '-', starting and ending with a letter or digit"  # noqa: S105 - a rule, not a password
# How a reference is written into JSON (a record's spec): {"$secret": "<name>"}.
SECRET_REF_KEY = "$secret"  # noqa: S105 - a JSON key, not a password


def secret_name_error(name: object) -> str | None:
    """Why ``name`` is not a valid secret name, or ``None`` if it is."""
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if not SECRET_NAME.fullmatch(name):
        return f"{name[:140]!r} is not a valid secret name: {SECRET_NAME_RULE}"
    return None


@dataclass(frozen=True, slots=True)
class SecretRef:
    """A secret, by name. Only the name travels: into specs, the journal, events and logs.

    The value stays in Graphene's encrypted store and is read on the server where it is used
    (an SSH install, a kind that needs a password). ``ctx.secret("name")`` makes one.
    """

    name: str

    def __post_init__(self) -> None:
        error = secret_name_error(self.name)
        if error is not None:
            raise ValueError(f"secret name {error}")

    def to_json(self) -> dict[str, str]:
        """The form stored in specs: ``{"$secret": name}``."""
        return {SECRET_REF_KEY: self.name}


def encode_secret_refs(value: Any) -> Any:
    """``value`` with every ``SecretRef`` and ``ArtifactRef`` (in dicts, lists and tuples)
    replaced by its JSON form (``{"$secret": name}``, ``{"$artifact": id}``)."""
    if isinstance(value, SecretRef | ArtifactRef):
        return value.to_json()
    if isinstance(value, Mapping):
        return {key: encode_secret_refs(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [encode_secret_refs(item) for item in value]
    return value


def secret_ref_name(value: Any) -> str | None:
    """The secret name if ``value`` is a reference in its JSON form, else ``None``."""
    if isinstance(value, Mapping) and len(value) == 1 and SECRET_REF_KEY in value:
        name = value[SECRET_REF_KEY]
        return name if isinstance(name, str) else None
    return None
