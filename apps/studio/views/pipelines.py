"""Pipelines: each with its schemas, concurrency policy, recent runs, success rate and stand;
a pipeline's page starts a run from a form generated from its input schema, and shows its
triggers with their recent events, paused and resumed from there."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.contrib.admin import AdminSite
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone

from apps.core.errors import GrapheneError, ValidationFailed
from apps.pipelines import selectors, services
from apps.pipelines.delivery import sources
from apps.pipelines.models import Pipeline, Trigger, TriggerEvent
from apps.pipelines.services import triggers
from apps.studio.forms import form_fields, has_errors, inputs_from_post, show_errors
from apps.studio.views.common import render

RECENT_RUNS = 5
RATE_WINDOW = timedelta(days=30)
HISTORY = 20  # the newest delivery events shown on a pipeline's page
SOURCES_SHOWN = 200
TRIGGER_EVENTS = 10  # the newest events shown under each trigger


def _rates(request: HttpRequest) -> dict[int, tuple[int, int]]:
    return selectors.pipeline_run_stats(user=request.user, since=timezone.now() - RATE_WINDOW)


def pipeline_list(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    services.pipelines_sync_all()  # what the workers' code defines now (as the API's list does)
    pipelines = list(selectors.pipeline_list(user=request.user))
    recent = selectors.pipeline_recent_runs(user=request.user, per_pipeline=RECENT_RUNS)
    rates = _rates(request)
    stands = {s.stand.name: s for s in selectors.stand_list(user=request.user)}
    rows = [(p, recent.get(p.pk, []), rates.get(p.pk, (0, 0)), stands.get(p.name)) for p in pipelines]
    context = {
        "rows": rows,
        "window_days": RATE_WINDOW.days,
        "sources": list(sources.source_list(user=request.user).order_by("namespace", "name")[:SOURCES_SHOWN]),
    }
    return render(request, site, "studio/pipelines.html", context, title="Pipelines")


def pipeline_detail(request: HttpRequest, *, site: AdminSite, name: str) -> HttpResponse:
    try:
        definition = services.definition_get(name, user=request.user)
    except GrapheneError:
        raise Http404(f"no pipeline {name!r} is loaded") from None
    pipeline = services.pipeline_sync(definition)
    fields = form_fields(pipeline.input_schema)
    problems: list[str] = []
    if request.method == "POST":
        inputs = inputs_from_post(fields, request.POST)
        if not has_errors(fields):
            try:
                run = services.run_start(pipeline_name=pipeline.name, inputs=inputs, actor=request.user)
            except ValidationFailed as exc:
                problems = show_errors(fields, exc.fields) or ([] if has_errors(fields) else [exc.detail])
            except GrapheneError as exc:
                problems = [exc.detail]
            else:
                return HttpResponseRedirect(reverse("admin:studio_run", args=[run.pk], current_app=site.name))
    ended, succeeded = _rates(request).get(pipeline.pk, (0, 0))
    context: dict[str, Any] = {
        "pipeline": pipeline,
        "fields": fields,
        "problems": problems,
        "output_fields": form_fields(pipeline.output_schema) if pipeline.output_schema else [],
        "recent": selectors.pipeline_recent_runs(user=request.user, per_pipeline=10).get(pipeline.pk, []),
        "rate": (ended, succeeded),
        "window_days": RATE_WINDOW.days,
        "stand": selectors.stand_find(user=request.user, pipeline=pipeline.name),
    }
    history = list(pipeline.events.select_related("actor").order_by("-id")[:HISTORY])
    context["history"] = history
    context["activated_at"] = history[0].created_at if history else None
    context["triggers"] = _triggers(request, pipeline)
    return render(request, site, "studio/pipeline.html", context, title=pipeline.name)


def _triggers(request: HttpRequest, pipeline: Pipeline) -> list[tuple[Trigger, list[TriggerEvent]]]:
    """The pipeline's triggers (those the user may read), each with its newest events."""
    rows = selectors.trigger_list(user=request.user, pipeline=pipeline.name).select_related("last_run__pipeline")
    return [
        (trigger, list(trigger.events.select_related("run__pipeline", "actor").order_by("-id")[:TRIGGER_EVENTS]))
        for trigger in rows
    ]


_TRIGGER_ACTIONS = {"pause": True, "resume": False}


def trigger_action(request: HttpRequest, *, site: AdminSite, name: str, trigger_id: Any, action: str) -> HttpResponse:
    """Pause or resume a trigger (POST): the service the API's ``triggers/{id}/pause|resume``
    calls, after the same check; the outcome is the pipeline page's message."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if action not in _TRIGGER_ACTIONS:
        raise Http404(f"no action {action!r}")
    try:
        trigger = selectors.trigger_get(user=request.user, trigger_id=trigger_id)
    except GrapheneError:
        raise Http404(f"no trigger {trigger_id}") from None
    if trigger.pipeline.name != name:
        raise Http404(f"pipeline {name!r} has no trigger {trigger_id}")
    try:
        trigger = triggers.trigger_pause(trigger=trigger, paused=_TRIGGER_ACTIONS[action], actor=request.user)
    except GrapheneError as exc:
        messages.error(request, f"{action.capitalize()}: {exc.detail}")
    else:
        if trigger.paused:
            messages.success(request, f"Paused: {trigger} starts nothing; each cause it skips is in its events.")
        else:
            messages.success(request, f"Resumed: {trigger} starts runs again.")
    back = reverse("admin:studio_pipeline", args=[name], current_app=site.name)
    return HttpResponseRedirect(f"{back}#trigger-{trigger.name}")
