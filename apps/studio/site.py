"""The Studio's admin site: the stock admin's login, permissions and model pages, plus the
Studio's own pages (home, runs, stands) at the top of its URLs."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, URLResolver, path


class StudioSite(admin.AdminSite):
    site_header = "Graphene Studio"
    site_title = "Graphene Studio"
    index_title = "Home"
    # The Studio's own navigation (runs, pipelines, records, ...) replaces the model list.
    enable_nav_sidebar = False

    def get_urls(self) -> list[URLResolver | URLPattern]:
        from apps.studio.views import agents, artifacts, pipelines, runs, stands, topology

        def page(route: str, view: Any, name: str) -> URLPattern:
            return path(route, self.admin_view(view), name=name, kwargs={"site": self})

        studio = [
            page("runs/", runs.run_list, "studio_runs"),
            page("runs/<uuid:run_id>/", runs.run_detail, "studio_run"),
            page("runs/<uuid:run_id>/<str:action>/", runs.run_action, "studio_run_action"),
            page("stands/", stands.stand_list, "studio_stands"),
            page("pipelines/", pipelines.pipeline_list, "studio_pipelines"),
            page("pipelines/<str:name>/", pipelines.pipeline_detail, "studio_pipeline"),
            page("agents/", agents.agent_board, "studio_agents"),
            page("artifacts/", artifacts.artifact_list, "studio_artifacts"),
            page("artifacts/<uuid:artifact_id>/", artifacts.artifact_detail, "studio_artifact"),
            page("topology/runs/<uuid:run_id>/", topology.run_topology, "studio_run_topology"),
            page("topology/stands/<str:pipeline>/", topology.stand_topology, "studio_stand_topology"),
        ]
        return [*studio, *super().get_urls()]

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        from apps.studio.views import home

        return home.home(request, site=self, extra_context=extra_context)
