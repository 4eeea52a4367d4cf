"""Artifacts: what runs published, with digest and size, where they came from and who
attached them; downloads go through the API's content endpoint (the same permission check)."""

from __future__ import annotations

from typing import Any

from django.contrib.admin import AdminSite
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse

from apps.artifacts import selectors
from apps.core.errors import GrapheneError
from apps.pipelines import selectors as run_selectors
from apps.studio.views.common import render

PAGE_SIZE = 50


def artifact_list(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    name = request.GET.get("name") or None
    pipeline = request.GET.get("pipeline") or None
    run = request.GET.get("run") or None
    try:
        artifacts = selectors.artifact_list(
            user=request.user,
            name=name,
            pipeline=pipeline,
            published_by=run_selectors.pipeline_run_ids(pipeline=pipeline) if pipeline else None,
            run=run,
        )
    except GrapheneError as exc:
        raise Http404(exc.detail) from None
    artifacts = run_selectors.with_pipeline_name(artifacts).order_by("-created_at", "-pk")
    page = Paginator(artifacts, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "page": page,
        "artifacts": list(page.object_list),
        "name": name or "",
        "pipeline": pipeline or "",
        "run": run or "",
        "pipelines": [p.name for p in run_selectors.pipeline_list(user=request.user)],
        "query": query.urlencode(),
    }
    return render(request, site, "studio/artifacts.html", context, title="Artifacts")


def artifact_detail(request: HttpRequest, *, site: AdminSite, artifact_id: Any) -> HttpResponse:
    among = run_selectors.with_pipeline_name(selectors.artifacts_visible(user=request.user))
    try:
        artifact = selectors.artifact_get(user=request.user, artifact_id=artifact_id, among=among)
    except GrapheneError:
        raise Http404(f"no artifact {artifact_id}") from None
    publisher = None
    if artifact.created_by_run_id is not None:
        publisher = (
            run_selectors.run_visible(user=request.user)
            .select_related("pipeline")
            .filter(record_id=artifact.created_by_run_id)
            .first()
        )
    context = {
        "artifact": artifact,
        "publisher": publisher,
        "attached_by": list(run_selectors.runs_attaching_artifact(user=request.user, artifact_id=artifact.pk)[:100]),
    }
    return render(request, site, "studio/artifact.html", context, title=f"Artifact {artifact.spec.get('name', '')}")
