"""Runs: the list (newest first, filtered) and a run's page, live; cancel, resume, re-run."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin import AdminSite
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from django.utils.timezone import is_naive, make_aware

from apps.core import selectors as core_selectors
from apps.core.errors import GrapheneError
from apps.pipelines import selectors, services
from apps.pipelines.choices import TERMINAL, RunStatus
from apps.pipelines.models import Run
from apps.records import selectors as record_selectors
from apps.studio.views.common import render, waterfall

PAGE_SIZE = 50
JOURNAL_SHOWN = 1000
TREE_DEPTH = 50


def _when(request: HttpRequest, name: str) -> Any:
    raw = request.GET.get(name) or ""
    value = parse_datetime(raw) if raw else None
    if value is not None and is_naive(value):
        value = make_aware(value)
    return value


def run_list(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    statuses = [s for s in request.GET.getlist("status") if s in RunStatus.values]
    pipeline = request.GET.get("pipeline") or None
    search = request.GET.get("q") or None
    namespace = request.GET.get("namespace") or None
    runs = selectors.run_list(
        user=request.user,
        namespace=namespace,
        pipeline=pipeline,
        statuses=statuses,
        created_after=_when(request, "created_after"),
        created_before=_when(request, "created_before"),
        finished_after=_when(request, "finished_after"),
        search=search,
    ).select_related("created_by", "parent_run__pipeline")
    page = Paginator(runs.order_by("-created_at", "-number"), PAGE_SIZE).get_page(request.GET.get("page"))
    shown = list(page.object_list)
    waits = selectors.run_waits(runs=[r for r in shown if r.status == RunStatus.SUSPENDED])
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "page": page,
        "rows": [(run, waits.get(str(run.pk), [])) for run in shown],
        "statuses": RunStatus.choices,
        "chosen": statuses,
        "pipeline": pipeline or "",
        "namespace": namespace or "",
        "namespaces": [n.name for n in core_selectors.namespace_list(user=request.user)],
        "pipelines": [p.name for p in selectors.pipeline_list(user=request.user)],
        "search": search or "",
        "query": query.urlencode(),
    }
    return render(request, site, "studio/runs.html", context, title="Runs", fragment="studio/_runs_table.html")


def _run(request: HttpRequest, run_id: Any) -> Run:
    try:
        return selectors.run_get(user=request.user, run_id=run_id)
    except GrapheneError:
        raise Http404(f"no run {run_id}") from None


def run_detail(request: HttpRequest, *, site: AdminSite, run_id: Any) -> HttpResponse:
    run = _run(request, run_id)
    root = None
    if run.record_id is not None:
        root = record_selectors.record_visible(user=request.user).filter(pk=run.record_id).first()
    tree = record_selectors.record_subtree(record=root, depth=TREE_DEPTH) if root is not None else []
    journal = selectors.run_journal(run=run, limit=JOURNAL_SHOWN + 1)
    waits = selectors.run_waits(runs=[run]).get(str(run.pk), []) if run.status == RunStatus.SUSPENDED else []
    context = {
        "run": run,
        "ended": run.status in TERMINAL,
        "waits": waits,
        "root": root,
        "tree": tree,
        "tree_ids": [str(r.pk) for r in tree],
        "journal": journal[:JOURNAL_SHOWN],
        "journal_truncated": len(journal) > JOURNAL_SHOWN,
        "history": list(selectors.run_events(run=run))[-50:],
        "children": list(run.children.select_related("pipeline").order_by("group", "group_index")),
        "timeline": waterfall(selectors.run_trace(run=run)["root"]),
    }
    fragment = {
        "tree": "studio/_run_tree.html",
        "status": "studio/_run_status.html",
        "timeline": "studio/_run_timeline.html",
    }.get(request.GET.get("fragment", ""))
    return render(
        request, site, "studio/run.html", context, title=f"{run.pipeline.name}#{run.number}", fragment=fragment
    )


_ACTIONS = {
    "cancel": ("Cancel", "The run ends now; everything it owns is deleted, children first."),
    "resume": ("Resume", "The run goes again by replay: what its journal holds is not done twice."),
    "rerun": ("Run again", "A new run of the pipeline starts with the same inputs."),
}


def run_action(request: HttpRequest, *, site: AdminSite, run_id: Any, action: str) -> HttpResponse:
    """A confirmation page (GET), then the same service the API calls (POST)."""
    if action not in _ACTIONS:
        raise Http404(f"no action {action!r}")
    run = _run(request, run_id)
    verb, explanation = _ACTIONS[action]
    if request.method == "POST":
        target = run
        try:
            if action == "cancel":
                services.run_cancel(run=run, actor=request.user)
            elif action == "resume":
                services.run_resume(run=run, actor=request.user)
            else:
                target = services.run_start(pipeline_name=run.pipeline.name, inputs=run.inputs, actor=request.user)
        except GrapheneError as exc:
            messages.error(request, f"{verb}: {exc.detail}")
        else:
            messages.success(request, f"{verb}: done for {target.pipeline.name}#{target.number}.")
        return HttpResponseRedirect(reverse("admin:studio_run", args=[target.pk], current_app=site.name))
    context = {"run": run, "action": action, "verb": verb, "explanation": explanation}
    return render(request, site, "studio/run_confirm.html", context, title=f"{verb} {run.pipeline.name}#{run.number}?")
