"""The Studio's template tags: status and phase badges, durations, TTL countdowns, and whether
the user may do what a link leads to."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from apps.core import access
from apps.pipelines.causes import cause_of, cause_text
from apps.pipelines.services.triggers import trigger_summary as summary_of
from apps.studio.views.common import duration, short_duration

register = template.Library()

# A badge's colour class by what the word means to the person reading it.
_TONE = {
    "succeeded": "ok",
    "ready": "ok",
    "connected": "ok",
    "running": "busy",
    "queued": "busy",
    "creating": "busy",
    "pending": "busy",
    "updating": "busy",
    "deleting": "busy",
    "suspended": "wait",
    "waiting": "wait",
    "drifted": "warn",
    "cancelled": "muted",
    "deleted": "muted",
    "failed": "bad",
    "timed_out": "bad",
    "create_failed": "bad",
    "delete_failed": "bad",
    "lost": "bad",
}


def _badge(value: str, kind: str) -> SafeString:
    label = value.replace("_", " ")
    return format_html(
        '<span class="studio-badge tone-{}" data-{}="{}">{}</span>', _TONE.get(value, "muted"), kind, value, label
    )


@register.simple_tag
def status_badge(status: str) -> SafeString:
    return _badge(str(status), "status")


@register.simple_tag
def phase_badge(phase: str) -> SafeString:
    return _badge(str(phase), "phase")


@register.simple_tag
def took(start: datetime | None, end: datetime | None = None) -> str:
    """How long from ``start`` to ``end`` (to now while it goes on), shortly."""
    return short_duration(duration(start, end))


@register.simple_tag
def ttl(expires_at: datetime | None) -> SafeString:
    """A countdown to ``expires_at`` (the page's script keeps it ticking), or "no TTL"."""
    if expires_at is None:
        return format_html('<span class="studio-ttl none">{}</span>', "no TTL")
    left = expires_at - timezone.now()
    text = "expired" if left <= timedelta(0) else short_duration(left)
    return format_html(
        '<time class="studio-ttl" datetime="{}" data-countdown="{}">{}</time>',
        expires_at.isoformat(),
        expires_at.isoformat(),
        text,
    )


@register.filter
def tone(value: str) -> str:
    """The colour class of a status or phase (what ``status_badge`` and ``phase_badge`` use)."""
    return _TONE.get(str(value), "muted")


@register.filter
def as_json(value: Any) -> str:
    """A JSON value as people read it: indented, keys in their order, non-ASCII as is."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@register.filter
def get(mapping: dict[str, Any], key: str) -> Any:
    return mapping.get(str(key))


@register.simple_tag(takes_context=True)
def may(context: template.Context, verb: str, resource: str, namespace: str | None = None) -> bool:
    """Whether the page's user may ``verb`` ``resource`` in ``namespace`` (in some namespace,
    without one): a link to a page shows only to those it would not refuse."""
    user = context["request"].user
    if namespace is None:
        return access.grants(user).anywhere(verb, resource)
    return access.may(user, verb, resource, namespace)


@register.simple_tag
def run_cause(run: Any, link_parent: bool = False) -> SafeString:
    """Why the run started, in one line (``apps.pipelines.causes``), the run that caused it (a
    parent run, an upstream run) and the trigger linked. ``link_parent``: the parent's link
    carries ``id="run-parent"`` (the run's own page)."""
    cause = cause_of(run)
    kind = str(cause.get("type") or "system")

    def run_link(ident: Any, name: Any) -> SafeString:
        href = reverse("admin:studio_run", args=[ident])
        if kind == "parent" and link_parent:
            return format_html('<a href="{}" id="run-parent">{}</a>', href, name or ident)
        return format_html('<a href="{}">{}</a>', href, name or ident)

    trigger = ""
    if cause.get("trigger"):
        href = reverse("admin:studio_pipeline", args=[run.pipeline.name]) + f"#trigger-{cause['trigger']}"
        trigger = format_html(' (trigger <a href="{}">{}</a>)', href, cause["trigger"])
    if kind == "parent" and cause.get("run"):
        body = format_html("parent run {}", run_link(cause["run"], cause.get("name")))
    elif kind == "upstream" and cause.get("run"):
        upstream = run_link(cause["run"], cause.get("name"))
        body = format_html("run {} {}{}", upstream, cause.get("status", "ended"), trigger)
    elif kind == "cron":
        body = format_html("cron <time>{}</time>{}", cause.get("instant"), trigger)
    elif kind == "webhook":
        body = format_html("webhook {} delivery <code>{}</code>{}", cause.get("event"), cause.get("delivery"), trigger)
    else:
        body = format_html("{}", cause_text(cause))
    return format_html('<span class="studio-cause" data-cause="{}">{}</span>', kind, body)


@register.filter
def trigger_summary(spec: dict[str, Any]) -> str:
    """A trigger's spec in one line (as the API's ``summary``)."""
    return summary_of(spec)
