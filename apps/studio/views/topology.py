"""Topology: the records of a run or a stand, drawn under the machine (agent) and the Docker
network they live on; every box links to its record."""

from __future__ import annotations

from typing import Any

from django.contrib.admin import AdminSite
from django.http import Http404, HttpRequest, HttpResponse

from apps.agents import selectors as agent_selectors
from apps.pipelines import selectors as run_selectors
from apps.records import selectors as record_selectors
from apps.records.models import Record
from apps.studio import topology
from apps.studio.views.common import render
from apps.studio.views.runs import _run

# Deeper than any tree a pipeline declares; the picture shows what a page can hold.
DEPTH = 50
LIMIT = 2000


def run_topology(request: HttpRequest, *, site: AdminSite, run_id: Any) -> HttpResponse:
    run = _run(request, run_id)
    root = None
    if run.record_id is not None:
        root = record_selectors.record_visible(user=request.user).filter(pk=run.record_id).first()
    title = f"{run.pipeline.name}#{run.number}"
    return _draw(request, site, root, title=f"Topology of {title}", back=("run", run))


def stand_topology(request: HttpRequest, *, site: AdminSite, pipeline: str) -> HttpResponse:
    stand = run_selectors.stand_find(user=request.user, pipeline=pipeline)
    if stand is None:
        raise Http404(f"pipeline {pipeline!r} has no stand")
    return _draw(request, site, stand, title=f"Topology of the stand of {pipeline}", back=("stand", pipeline))


def _draw(
    request: HttpRequest, site: AdminSite, root: Record | None, *, title: str, back: tuple[str, Any]
) -> HttpResponse:
    records = record_selectors.record_subtree(record=root, depth=DEPTH) if root is not None else []
    live = [r for r in records[1:] if r.phase != "deleted"][:LIMIT]  # the root is the frame
    on_agents = {str(a) for a in ((r.spec or {}).get("agent") for r in live) if a}
    agents = agent_selectors.agent_list(user=request.user, include_deleted=True).filter(pk__in=on_agents)
    names = {str(pk): name for pk, name in agents.values_list("pk", "name")}  # no capabilities needed
    boxes, width, height = topology.layout(live, names)
    context = {
        "root": root,
        "boxes": boxes,
        "width": width,
        "height": height,
        "back": back,
        "shown": len(live),
        "truncated": len(records) - 1 > LIMIT,
    }
    return render(request, site, "studio/topology.html", context, title=title)
