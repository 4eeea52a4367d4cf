"""Writes of observability data: log lines, per-record metric points, and the retention purge."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.core.errors import ValidationFailed
from apps.observability.models import LogLine, MetricPoint, Span

SEVERITIES = ("debug", "info", "warning", "error")
# Prometheus' metric and label name rules, so that series can be exported as they are.
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,199}")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,62}")
MAX_LABELS = 10
MAX_LABEL_VALUE = 200
# Rows deleted per statement by the purge, and statements per purge call (bounded work).
PURGE_BATCH = 10_000
PURGE_ROUNDS = 50


def log_write(
    *, record_id: Any, message: str, severity: str = "info", source: str = "", stream: str = "stdout"
) -> LogLine:
    """Append a line to a record's log."""
    if severity not in SEVERITIES:
        severity = "info"
    return LogLine.objects.create(
        record_id=record_id, at=timezone.now(), stream=stream, severity=severity, source=source[:120], message=message
    )


@dataclass(frozen=True)
class Sample:
    """One value of a record's series, for ``metric_write_many``."""

    record_id: Any
    name: str
    value: float
    at: datetime | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


def _point(sample: Sample, now: datetime) -> MetricPoint:
    if not METRIC_NAME.fullmatch(sample.name or ""):
        raise ValidationFailed(
            f"metric name {sample.name!r} must match [a-zA-Z_:][a-zA-Z0-9_:]* (at most 200 characters)",
            fields={"name": ["invalid metric name"]},
        )
    try:
        value = float(sample.value)
    except (TypeError, ValueError):
        raise ValidationFailed(
            f"{sample.name}: value {sample.value!r} is not a number", fields={"value": ["not a number"]}
        ) from None
    if not math.isfinite(value):
        raise ValidationFailed(f"{sample.name}: value must be finite, not {value}", fields={"value": ["not finite"]})
    labels = dict(sample.labels or {})
    if len(labels) > MAX_LABELS or not all(
        isinstance(k, str) and LABEL_NAME.fullmatch(k) and isinstance(v, str) and len(v) <= MAX_LABEL_VALUE
        for k, v in labels.items()
    ):
        raise ValidationFailed(
            f"{sample.name}: labels must map at most {MAX_LABELS} names ([a-zA-Z_][a-zA-Z0-9_]*) to strings "
            f"of at most {MAX_LABEL_VALUE} characters",
            fields={"labels": ["invalid labels"]},
        )
    at = sample.at or now
    if timezone.is_naive(at):
        raise ValidationFailed(f"{sample.name}: 'at' must be timezone-aware", fields={"at": ["naive datetime"]})
    return MetricPoint(record_id=sample.record_id, name=sample.name, labels=labels, at=at, value=value)


def metric_write(
    *, record_id: Any, name: str, value: float, at: datetime | None = None, labels: Mapping[str, str] | None = None
) -> MetricPoint:
    """Add one point to the record's series ``name`` (and ``labels``) at ``at`` (default now)."""
    point = _point(Sample(record_id, name, value, at, labels or {}), timezone.now())
    point.save(force_insert=True)
    return point


def metric_write_many(*, samples: Iterable[Sample]) -> int:
    """Add many points in one statement (all validated first: all or nothing)."""
    now = timezone.now()
    points = [_point(sample, now) for sample in samples]
    MetricPoint.objects.bulk_create(points)
    return len(points)


def _purge(model: type[MetricPoint] | type[Span], column: str, cutoff: datetime) -> int:
    deleted = 0
    for _ in range(PURGE_ROUNDS):
        ids = list(
            model.objects.filter(**{f"{column}__lt": cutoff})
            .order_by(column)
            .values_list("pk", flat=True)[:PURGE_BATCH]
        )
        if not ids:
            break
        with transaction.atomic():
            deleted += model.objects.filter(pk__in=ids).delete()[0]
        if len(ids) < PURGE_BATCH:
            break
    return deleted


def observability_purge(*, now: datetime | None = None) -> dict[str, int]:
    """Delete metric points and spans older than their retention, in bounded batches (the
    beat runs this hourly; a backlog larger than one call's share is taken by the next)."""
    now = now or timezone.now()
    return {
        "metric_points": _purge(MetricPoint, "at", now - settings.GRAPHENE_METRIC_POINTS_RETENTION),
        "spans": _purge(Span, "started_at", now - settings.GRAPHENE_SPANS_RETENTION),
    }
