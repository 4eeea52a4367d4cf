"""The Studio's admin site: the stock admin's login, permissions and model pages, plus the
Studio's own pages (home, runs, stands) at the top of its URLs."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, URLResolver, path, reverse
from django.utils.http import url_has_allowed_host_and_scheme

from apps.core import access, throttle


class StudioSite(admin.AdminSite):
    site_header = "Graphene Studio"
    site_title = "Graphene Studio"
    index_title = "Home"
    # The Studio's own navigation (runs, pipelines, records, ...) replaces the model list.
    enable_nav_sidebar = False

    def has_permission(self, request: HttpRequest) -> bool:
        """Staff, or anyone a role binding grants something: what they then see and may do is
        the access module's to say, page by page (apps/core/access.py)."""
        user = request.user
        if not (user.is_active and user.is_authenticated):
            return False
        grants = access.grants(user)
        return bool(user.is_staff or grants.superuser or grants.everywhere or grants.by_namespace)

    def get_urls(self) -> list[URLResolver | URLPattern]:
        from apps.studio.views import agents, artifacts, audit, pipelines, runs, stands, topology

        def page(route: str, view: Any, name: str, verb: str, resource: str) -> URLPattern:
            """A Studio page reachable by whoever may ``verb`` ``resource`` in some namespace;
            what it shows is narrowed by the selectors, and what it changes is checked again
            by the services, with the object's namespace."""

            def guarded(request: HttpRequest, **kwargs: Any) -> Any:
                if not access.grants(request.user).anywhere(verb, resource):
                    raise PermissionDenied(access.denial(request.user, verb, resource, None).detail)
                return view(request, **kwargs)

            guarded.access_rule = (verb, resource)  # type: ignore[attr-defined]  # read by tests/access
            return path(route, self.admin_view(guarded), name=name, kwargs={"site": self})

        studio = [
            page("runs/", runs.run_list, "studio_runs", "list", "runs"),
            page("runs/<uuid:run_id>/", runs.run_detail, "studio_run", "get", "runs"),
            page("runs/<uuid:run_id>/<str:action>/", runs.run_action, "studio_run_action", "get", "runs"),
            page("stands/", stands.stand_list, "studio_stands", "list", "stands"),
            page("pipelines/", pipelines.pipeline_list, "studio_pipelines", "list", "pipelines"),
            page("pipelines/<str:name>/", pipelines.pipeline_detail, "studio_pipeline", "get", "pipelines"),
            page(
                "pipelines/<str:name>/triggers/<uuid:trigger_id>/<str:action>/",
                pipelines.trigger_action,
                "studio_trigger_action",
                "get",  # the service checks "update" in the trigger's namespace, saying so on the page
                "pipelines",
            ),
            page("agents/", agents.agent_board, "studio_agents", "list", "agents"),
            page("artifacts/", artifacts.artifact_list, "studio_artifacts", "list", "artifacts"),
            page("artifacts/<uuid:artifact_id>/", artifacts.artifact_detail, "studio_artifact", "get", "artifacts"),
            page("topology/runs/<uuid:run_id>/", topology.run_topology, "studio_run_topology", "get", "runs"),
            page("topology/stands/<str:pipeline>/", topology.stand_topology, "studio_stand_topology", "get", "stands"),
            page("audit/", audit.audit_list, "studio_audit", "list", "audit"),
        ]
        return [*studio, *super().get_urls()]

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The admin's login, with failed attempts limited per client address and per username
        (``apps/core/throttle.py``): over the limit, the form answers 429 without judging the
        password, saying when to try again. A successful login is never counted."""
        if request.method != "POST":
            return super().login(request, extra_context)
        address = throttle.request_client_address(request)
        username = str(request.POST.get("username", ""))[:150]
        wait = throttle.auth_failure_throttled(address, username=username)
        if wait is not None:
            return self._login_throttled(request, wait, username)
        response = super().login(request, extra_context)
        if response.status_code == 200:  # the form again, with its errors: refused
            throttle.auth_failure_record(address=address, username=username)
        return response

    def _login_throttled(self, request: HttpRequest, wait: int, username: str) -> HttpResponse:
        from django.contrib.admin.forms import AdminAuthenticationForm

        next_url = str(request.POST.get(REDIRECT_FIELD_NAME) or request.GET.get(REDIRECT_FIELD_NAME) or "")
        if not url_has_allowed_host_and_scheme(next_url, {request.get_host()}, require_https=request.is_secure()):
            next_url = reverse("admin:index", current_app=self.name)
        context = {
            **self.each_context(request),
            "title": "Log in",
            "subtitle": None,
            "app_path": request.get_full_path(),
            "form": (self.login_form or AdminAuthenticationForm)(request, initial={"username": username}),
            REDIRECT_FIELD_NAME: next_url,
            "throttled": (
                f"Too many failed logins from this address or for this username: try again in {wait} seconds."
            ),
        }
        request.current_app = self.name
        response = TemplateResponse(request, self.login_template or "admin/login.html", context, status=429)
        response["Retry-After"] = str(wait)
        return response

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        from apps.studio.views import home

        return home.home(request, site=self, extra_context=extra_context)
