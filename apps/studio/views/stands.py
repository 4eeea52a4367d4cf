"""Stands: what each pipeline's stand holds, from which run, until when; extend or release."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.admin import AdminSite
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone

from apps.core.errors import GrapheneError
from apps.pipelines import selectors
from apps.studio.views.common import EXTEND_CHOICES, extend_or_release, render


def stand_list(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    if request.method == "POST":
        return _act(request, site)
    expiring = request.GET.get("expiring") == "1"
    before = timezone.now() + timedelta(hours=1) if expiring else None
    holdings = list(selectors.stand_holdings_all(user=request.user, expiring_before=before))
    stands: dict[str, list[object]] = {}
    for holding in holdings:
        stands.setdefault(holding.parent.name, []).append(holding)
    context = {
        "stands": sorted(stands.items()),
        "expiring": expiring,
        "extend_choices": [label for label, _ in EXTEND_CHOICES],
        "summaries": selectors.stand_list(user=request.user),
    }
    return render(request, site, "studio/stands.html", context, title="Stands")


def _act(request: HttpRequest, site: AdminSite) -> HttpResponse:
    """Extend or release one holding: the services the stands API calls, after the same check."""
    pipeline, record_id, what = request.POST.get("pipeline", ""), request.POST.get("record"), request.POST.get("do")
    try:
        holding = selectors.stand_holding(user=request.user, pipeline=pipeline, record_id=record_id)
        extend_or_release(request, holding, what or "")
    except GrapheneError as exc:
        messages.error(request, exc.detail)
    return HttpResponseRedirect(reverse("admin:studio_stands", current_app=site.name))
