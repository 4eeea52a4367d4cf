"""The audit trail in the Studio: who changed what, newest first, with the API's filters.

Paged by keyset (the instant and id of the last row shown), not by page number: the trail
grows with every write, and counting it for a page number would cost more than the page."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.admin import AdminSite
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.utils.dateparse import parse_datetime
from django.utils.timezone import is_naive, make_aware

from apps.core import access, selectors
from apps.core.models import AuditActorKind
from apps.studio.views.common import render

PAGE_SIZE = 50
FILTERS = ("namespace", "actor", "actor_kind", "action", "object", "request_id")


def _when(raw: str) -> datetime | None:
    """A date-time field's value (naive: UTC); what does not parse filters nothing."""
    try:
        value = parse_datetime(raw) if raw else None
    except ValueError:
        return None
    if value is not None and is_naive(value):
        value = make_aware(value)
    return value


def _older(raw: str) -> tuple[datetime, int] | None:
    """The keyset of an "older" link: ``<ISO instant>|<id>``."""
    instant, _, pk = raw.partition("|")
    at = _when(instant)
    return (at, int(pk)) if at is not None and pk.isdigit() else None


def audit_list(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    chosen = {name: (request.GET.get(name) or "").strip() for name in FILTERS}
    if chosen["actor_kind"] not in AuditActorKind.values:
        chosen["actor_kind"] = ""
    namespaces = access.visible_namespaces(request.user, "list", "audit")
    if chosen["namespace"] and namespaces is not None and chosen["namespace"] not in namespaces:
        chosen["namespace"] = ""  # not one they may read: the list shows what they may, unfiltered
    rows = selectors.audit_list(
        user=request.user,
        namespace=chosen["namespace"] or None,
        actor=chosen["actor"] or None,
        actor_kind=chosen["actor_kind"] or None,
        action=chosen["action"] or None,
        object_id=chosen["object"] or None,
        since=_when(request.GET.get("since", "")),
        until=_when(request.GET.get("until", "")),
        request_id=chosen["request_id"] or None,
    )
    older = _older(request.GET.get("older", ""))
    if older is not None:
        at, pk = older
        rows = rows.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=pk))
    shown = list(rows[: PAGE_SIZE + 1])
    more, shown = len(shown) > PAGE_SIZE, shown[:PAGE_SIZE]
    query = request.GET.copy()
    query.pop("older", None)
    context: dict[str, Any] = {
        "rows": shown,
        "chosen": chosen,
        "since": request.GET.get("since", ""),
        "until": request.GET.get("until", ""),
        "actor_kinds": AuditActorKind.values,
        "namespaces": sorted(namespaces) if namespaces is not None else None,
        "query": query.urlencode(),
        "older": f"{shown[-1].created_at.isoformat()}|{shown[-1].pk}" if more else "",
        "paged": older is not None,
    }
    return render(request, site, "studio/audit.html", context, title="Audit")
