"""The API's body parsers, bounded: a body over ``GRAPHENE_API_MAX_BODY_BYTES`` is a 413, JSON
nested deeper than ``GRAPHENE_API_MAX_JSON_DEPTH`` a 400 found before the parser recurses
into it, and a value PostgreSQL cannot store (a NUL character, a lone surrogate, a number
beyond JSON's range) a 400 naming its path, before any view sees the body."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import RequestDataTooBig
from rest_framework import parsers
from rest_framework.exceptions import ParseError

from apps.core import validation


def _read_bounded(stream: Any, parser_context: Mapping[str, Any] | None) -> bytes:
    """The whole body, refused with a 413 as soon as it is known to exceed the bound (DRF has
    usually read it already, bounded by Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``, the same)."""
    limit = validation.max_body_bytes()
    request = (parser_context or {}).get("request")
    declared = str(getattr(request, "META", {}).get("CONTENT_LENGTH") or "")
    if declared.isdigit() and int(declared) > limit:
        raise validation.too_large(int(declared))
    raw = stream.read(limit + 1) if stream is not None else b""
    if len(raw) > limit:
        raise validation.too_large()
    return bytes(raw)


def _strict_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class JSONParser(parsers.JSONParser):
    """JSON bodies: bounded in size and depth, every string (keys too) storable."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        raw = _read_bounded(stream, parser_context)
        validation.check_json_text(raw)
        encoding = parsers.get_encoding(parser_context or {})  # type: ignore[attr-defined]  # untyped in the stubs
        try:
            data = json.loads(raw.decode(encoding), parse_constant=_strict_constant)
        except (ValueError, RecursionError) as exc:  # RecursionError: never, after the depth check
            raise ParseError(f"JSON parse error - {exc}") from None
        return validation.check_json(data, what="the body")


class MultiPartParser(parsers.MultiPartParser):
    """Multipart bodies: files are streamed (unbounded here); the other fields are bounded by
    Django (``DATA_UPLOAD_MAX_MEMORY_SIZE``, a 413 here) and must be storable text."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        try:
            parsed = super().parse(stream, media_type, parser_context)
        except RequestDataTooBig:
            raise validation.too_large() from None
        validation.check_params(parsed.data, prefix="")
        return parsed
