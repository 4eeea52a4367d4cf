"""Writes of observability data."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from apps.observability.models import LogLine

SEVERITIES = ("debug", "info", "warning", "error")


def log_write(
    *, record_id: Any, message: str, severity: str = "info", source: str = "", stream: str = "stdout"
) -> LogLine:
    """Append a line to a record's log."""
    if severity not in SEVERITIES:
        severity = "info"
    return LogLine.objects.create(
        record_id=record_id, at=timezone.now(), stream=stream, severity=severity, source=source[:120], message=message
    )
