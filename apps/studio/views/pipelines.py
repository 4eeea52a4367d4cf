"""Pipelines: each with its schemas, concurrency policy, recent runs, success rate and stand;
a pipeline's page starts a run from a form generated from its input schema, shows its
triggers with their recent events (paused and resumed from there), and the plan of a run
(what it would do, without doing it) for the default inputs when asked (``?plan=1``), or for
the form's inputs when its Plan button is pressed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.contrib.admin import AdminSite
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from graphene_sdk._plan_text import entry_text

from apps.core.errors import GrapheneError, ValidationFailed
from apps.pipelines import selectors, services
from apps.pipelines.delivery import sources
from apps.pipelines.models import Pipeline, Trigger, TriggerEvent
from apps.pipelines.services import triggers
from apps.pipelines.services.plan import pipeline_plan
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


def _plan_rows(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's tree as rows with their depth (``data-level``: the page's CSP allows no style)."""
    rows: list[dict[str, Any]] = []

    def walk(node: dict[str, Any], level: int) -> None:
        kind = node["kind"]
        if kind == "graphene.run":
            label = ("run " if node["ref"] == "run" else "child run ") + node["name"]
        elif kind == "graphene.stand":
            label = f"stand {node['name']}"
        else:
            label = f"{kind}/{node['name']}"
        rows.append({"level": level, "label": label, "ref": node["ref"], "kind": kind, "node": node})
        for child in node.get("children", []):
            walk(child, level + 1)

    for root in plan["tree"]:
        walk(root, 0)
    return rows


def _plan_context(request: HttpRequest, name: str, inputs: dict[str, Any] | None, fields: Any) -> dict[str, Any]:
    """The plan shown on the page: for ``inputs`` (the form's, or ``{}``: the defaults); their
    errors on the form's fields when they were posted (``fields``), else a word of help."""
    context: dict[str, Any] = {"plan": None, "plan_problems": [], "plan_posted": fields is not None}
    context["plan_asked"] = inputs is not None or fields is not None
    if inputs is None:  # not asked for, or the form's own checks refused them (the fields say why)
        return context
    try:
        plan = pipeline_plan(name=name, inputs=inputs, actor=request.user)
    except ValidationFailed as exc:
        if fields is not None:
            context["plan_problems"] = show_errors(fields, exc.fields) or ([] if has_errors(fields) else [exc.detail])
        else:
            context["plan_problems"] = ["The default inputs are not enough: give the inputs above and press Plan."]
        return context
    except GrapheneError as exc:
        context["plan_problems"] = [exc.detail]
        return context
    context["plan"] = plan
    context["plan_rows"] = _plan_rows(plan)
    context["plan_calls"] = [{**e, "text": entry_text(e)} for e in plan["entries"]]
    return context


def pipeline_detail(request: HttpRequest, *, site: AdminSite, name: str) -> HttpResponse:
    try:
        definition = services.definition_get(name, user=request.user)
    except GrapheneError:
        raise Http404(f"no pipeline {name!r} is loaded") from None
    pipeline = services.pipeline_sync(definition)
    fields = form_fields(pipeline.input_schema)
    problems: list[str] = []
    planning = request.method == "POST" and "plan" in request.POST
    # A plan imports the code in a fresh process (about half a second): made when asked for
    # (``?plan=1``, the page's link, or the form's Plan button), never on every page load.
    plan_inputs: dict[str, Any] | None = {} if request.GET.get("plan") else None  # {}: the defaults
    if planning:
        inputs = inputs_from_post(fields, request.POST)
        plan_inputs = None if has_errors(fields) else inputs
    elif request.method == "POST":
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
    context.update(_plan_context(request, pipeline.name, plan_inputs, fields if planning else None))
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
