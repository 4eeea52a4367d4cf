"""One error shape for every API answer: ``{"error": code, "detail": text, "fields": {...}}``."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from apps.core.errors import GrapheneError


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    if isinstance(detail, dict):
        out: dict[str, list[str]] = {}
        for key, value in detail.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(detail, list) and detail and all(not isinstance(d, dict | list) for d in detail):
        return {prefix or "non_field_errors": [str(d) for d in detail]}
    if isinstance(detail, list):
        out = {}
        for i, value in enumerate(detail):
            out.update(_flatten(value, f"{prefix}.{i}" if prefix else str(i)))
        return out
    return {prefix or "non_field_errors": [str(detail)]}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, GrapheneError):
        body = {"error": exc.code, "detail": exc.detail, "fields": exc.fields}
        return Response(body, status=exc.status_code)
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        summary = "; ".join(f"{k}: {' '.join(v)}" for k, v in fields.items())
        return Response(
            {"error": "validation_failed", "detail": f"invalid request: {summary}", "fields": fields},
            status=status.HTTP_400_BAD_REQUEST,
        )
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(response.data, dict) and "detail" in response.data:
        code = getattr(getattr(exc, "detail", None), "code", None) or getattr(exc, "default_code", "error")
        response.data = {"error": str(code), "detail": str(response.data["detail"]), "fields": {}}
    return response
