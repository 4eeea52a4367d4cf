"""What the Studio's pages share: the admin's page context, fragments for live updates, and
how a run's status and waits read."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.admin import AdminSite
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone

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
