"""What the Studio's pages share: the admin's page context, fragments for live updates, and
how a run's status and waits read."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib import messages
from django.contrib.admin import AdminSite
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from apps.core.errors import GrapheneError
from apps.records import services as records
from apps.records.models import Record

# A fragment request (htmx, ``HX-Request``) re-renders only the part of a page that changed.
FRAGMENT_HEADER = "HX-Request"


def render(
    request: HttpRequest,
    site: AdminSite,
    template: str,
    context: dict[str, Any],
    *,
    title: str,
    fragment: str | None = None,
) -> TemplateResponse:
    """The page, inside the admin's frame; or, for an htmx request naming ``fragment``, only it."""
    if fragment is not None and request.headers.get(FRAGMENT_HEADER):
        return TemplateResponse(request, fragment, context)
    return TemplateResponse(request, template, {**site.each_context(request), "title": title, **context})


# What "extend" adds, one click: the same choices as graphenectl's `stand extend --by`.
EXTEND_CHOICES = [("1h", timedelta(hours=1)), ("1d", timedelta(days=1)), ("7d", timedelta(days=7))]


def extend_or_release(request: HttpRequest, record: Record, what: str) -> Record:
    """Release the record's TTL (``release``) or extend it by one of ``EXTEND_CHOICES``: the
    services the API's ``extend`` and ``release`` call; the outcome is the page's message."""
    if what == "release":
        record = records.record_release(record=record, actor=request.user)
        messages.success(request, f"Released: {record} is kept until someone deletes it or its owner dies.")
        return record
    by = dict(EXTEND_CHOICES).get(what)
    if by is None:
        raise GrapheneError(f"extend by one of {[label for label, _ in EXTEND_CHOICES]}, not {what!r}")
    record = records.record_extend(record=record, by=by, actor=request.user)
    messages.success(request, f"Extended: {record} now expires at {record.expires_at:%Y-%m-%d %H:%M} UTC.")
    return record


def duration(start: datetime | None, end: datetime | None) -> timedelta | None:
    """How long from ``start`` to ``end`` (to now while it goes on)."""
    if start is None:
        return None
    return (end or timezone.now()) - start


def short_duration(value: timedelta | None) -> str:
    if value is None:
        return "—"
    seconds = int(value.total_seconds())
    if seconds < 60:
        return f"{max(value.total_seconds(), 0):.1f} s" if seconds < 10 else f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    return f"{hours // 24} d {hours % 24} h"


@dataclass(frozen=True)
class Bar:
    """One row of a waterfall: a span placed on the time axis of the whole trace (percent)."""

    name: str
    depth: int
    start_pct: float
    width_pct: float
    took: str
    status: str
    message: str


def waterfall(root: dict[str, Any], *, limit: int = 500) -> list[Bar]:
    """A trace tree (``run_trace``'s shape) as bars in start order, depth first."""
    nodes: list[tuple[dict[str, Any], int]] = []

    def walk(node: dict[str, Any], depth: int) -> None:
        nodes.append((node, depth))
        for child in node.get("children") or []:
            walk(child, depth + 1)

    walk(root, 0)
    nodes = nodes[:limit]
    starts = [_instant(n.get("started_at")) for n, _ in nodes]
    ends = [_instant(n.get("ended_at")) or timezone.now() for n, _ in nodes]
    known = [s for s in starts if s is not None]
    if not known:
        return []
    first, last = min(known), max(ends)
    span = max((last - first).total_seconds(), 1e-6)
    bars = []
    for (node, depth), start, end in zip(nodes, starts, ends, strict=True):
        if start is None:
            continue
        offset = (start - first).total_seconds() / span * 100
        width = max((end - start).total_seconds() / span * 100, 0.3)
        bars.append(
            Bar(
                name=str(node.get("name", "")),
                depth=depth,
                start_pct=round(offset, 2),
                width_pct=round(min(width, 100 - offset), 2),
                took=short_duration(end - start) if node.get("ended_at") else f"{short_duration(end - start)} so far",
                status=str(node.get("status") or "unset"),
                message=str(node.get("status_message") or ""),
            )
        )
    return bars


def _instant(value: Any) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) else value
