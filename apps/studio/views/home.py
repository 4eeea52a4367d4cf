"""The Studio's home: what is running now and what needs a look, every number a link to the
list it counts."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.contrib.admin import AdminSite
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone

from apps.agents import selectors as agent_selectors
from apps.observability import metrics
from apps.pipelines import selectors as run_selectors
from apps.pipelines.choices import RunStatus
from apps.records import selectors as record_selectors
from apps.records.choices import Phase
from apps.studio.views.common import render

logger = logging.getLogger(__name__)

# The runs the home page names one by one (the suspended ones, with what they wait for).
SUSPENDED_SHOWN = 10
PROBLEM_PHASES = [Phase.CREATE_FAILED, Phase.DELETE_FAILED, Phase.DRIFTED]
ACTIVE_STATUSES = [RunStatus.WAITING, RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.SUSPENDED]


def home(request: HttpRequest, *, site: AdminSite, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
    user = request.user
    now = timezone.now()
    by_status = run_selectors.run_status_counts(user=user)
    suspended = list(
        run_selectors.run_list(user=user, statuses=[RunStatus.SUSPENDED]).order_by("-updated_at")[:SUSPENDED_SHOWN]
    )
    waits = run_selectors.run_waits(runs=suspended)
    try:
        queues = metrics.queue_depths()
    except Exception:  # the broker is down: the page says so rather than failing
        logger.warning("the Studio's home could not read the queue depths", exc_info=True)
        queues = None
    context = {
        "active": [(status, by_status.get(status, 0)) for status in ACTIVE_STATUSES],
        "suspended": [(run, waits.get(str(run.pk), [])) for run in suspended],
        "suspended_more": max(by_status.get(RunStatus.SUSPENDED, 0) - len(suspended), 0),
        "failures_24h": run_selectors.run_failures_since(user=user, since=now - timedelta(hours=24)),
        "since_24h": (now - timedelta(hours=24)).strftime("%Y-%m-%dT%H:%M"),
        "problems": list(record_selectors.record_phase_counts(user=user, phases=PROBLEM_PHASES).items()),
        "agents": agent_selectors.agent_connection_counts(user=user),
        "expiring": run_selectors.stand_holdings_expiring(user=user, before=now + timedelta(hours=1)),
        "queues": queues,
        "orphans_24h": record_selectors.orphan_findings_since(since=now - timedelta(hours=24)),
        "app_list": site.get_app_list(request),
        **(extra_context or {}),
    }
    return render(request, site, "studio/home.html", context, title="Home", fragment="studio/_home_counts.html")
