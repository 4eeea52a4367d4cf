"""The Studio's view of agents: read-only tables; actions call services.

An agent's terminal page (``agents/agent/<record id>/terminal/``, ``AgentAdmin.terminal_view``)
is xterm.js on the terminal websocket (``ws/agents/<id>/pty/``, ``AgentTerminalConsumer``).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from apps.agents import selectors, services
from apps.agents.models import Agent, AgentCommand, AgentToken
from apps.core import access
from apps.core.admin import AccessAdmin
from apps.core.errors import NotFound
from apps.core.security import csp_relax
from apps.records.models import Record


class ReadOnly(AccessAdmin):
    access_resource = "agents"


@admin.register(Agent)
class AgentAdmin(ReadOnly):
    """Read-only, truly: no change form reaches a field; the Studio's agents board is where
    agents are shown, and revoking credentials is an action calling the service."""

    list_display = [
        "record",
        "session",
        "version",
        "peer",
        "connected_at",
        "last_seen_at",
        "disconnected_at",
        "lost_at",
    ]
    list_filter = [("session", admin.EmptyFieldListFilter)]
    search_fields = ["record__name", "=record__id", "peer"]
    list_select_related = ["record"]
    actions = ["revoke_credentials"]
    access_namespace_field = "record__namespace"

    @admin.action(description="Revoke credentials (the agent must be bootstrapped again)", permissions=["revoke"])
    def revoke_credentials(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        for state in queryset.select_related("record"):
            access.require(request.user, "update", "agents", state.record.namespace)
            services.agent_credentials_revoke(
                record=state.record, reason=f"revoked by {request.user}", actor=request.user
            )
        messages.success(request, f"revoked the credentials of {queryset.count()} agent(s)")

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        # Revoking is the one change the Studio makes to an agent, through its service; the
        # connection state itself (session, peer, channel) is the gateway's alone: no form edits it.
        # The action acts on rows of the (namespace-narrowed) list: each is checked again.
        return access.grants(request.user).anywhere("update", "agents")

    # --- the terminal page ------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        # An Agent's primary key is its record's id, so the page sits beside the change page.
        # It comes first: the defaults end with a catch-all "<path:object_id>/" redirect.
        terminal = path(
            "<uuid:record_id>/terminal/",
            self.admin_site.admin_view(self.terminal_view),
            name="agents_agent_terminal",
        )
        return [terminal, *super().get_urls()]

    def _terminal_url(self, record_id: Any) -> str:
        return reverse("admin:agents_agent_terminal", args=[record_id], current_app=self.admin_site.name)

    def terminal_view(self, request: HttpRequest, record_id: uuid.UUID) -> HttpResponse:
        """A terminal on the agent's machine in the browser (xterm.js, ``agents/terminal.js``).

        It only renders: the page's websocket opens the terminal, and the gateway records it
        (``TerminalOpened``/``TerminalClosed``, or ``TerminalRefused``). Staff only (the admin
        site's own check), and ``open_terminal`` on agents in its namespace, as for the websocket.
        """
        try:
            record = selectors.agent_get(user=request.user, agent_id=record_id)
        except NotFound as exc:
            raise Http404(exc.detail) from None
        if not selectors.agent_can_open_terminal(user=request.user, agent=record):
            raise PermissionDenied(access.denial(request.user, "open_terminal", "agents", record.namespace).detail)
        state = selectors.agent_state(record=record)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Terminal on {record.name}",
            "agent": record,
            "state": state,
            "socket_path": f"/ws/agents/{record.pk}/pty/",
            # The breadcrumbs link the agent's pages only for those who may see them.
            "has_view_permission": state is not None and self.has_view_permission(request, state),
        }
        response = TemplateResponse(request, "admin/agents/agent/terminal.html", context)
        # xterm.js's DOM renderer writes <style> elements and style= attributes of its own (cell
        # sizes and colours measured and computed in the browser: no hash or nonce can name
        # them). Inline styles are allowed on this page only; scripts stay 'self' alone.
        return csp_relax(response, "style-src", "'unsafe-inline'")

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra_context = dict(extra_context or {})
        try:
            record_id = uuid.UUID(object_id)
        except ValueError:  # no such agent: the admin answers that
            record_id = None
        record = Record.objects.filter(pk=record_id).first() if record_id is not None else None
        if record is not None and selectors.agent_can_open_terminal(user=request.user, agent=record):
            extra_context["terminal_url"] = self._terminal_url(record_id)
        return super().change_view(request, object_id, form_url, extra_context)

    def get_list_display(self, request: HttpRequest) -> Any:
        columns = list(super().get_list_display(request))
        if access.grants(request.user).anywhere("open_terminal", "agents"):
            columns.append("terminal")
        return columns

    @admin.display(description="terminal")
    def terminal(self, obj: Agent) -> SafeString:
        return format_html('<a href="{}">Terminal</a>', self._terminal_url(obj.pk))


@admin.register(AgentToken)
class AgentTokenAdmin(ReadOnly):
    list_display = ["agent", "kind", "prefix", "created_at", "expires_at", "used_at", "last_used_at", "revoked_at"]
    list_filter = ["kind"]
    search_fields = ["=agent__id", "agent__name", "prefix"]
    exclude = ["digest"]
    list_select_related = ["agent"]
    access_namespace_field = "agent__namespace"


@admin.register(AgentCommand)
class AgentCommandAdmin(ReadOnly):
    list_display = ["id", "agent", "kind", "status", "guarantee", "exit_code", "created_at", "finished_at"]
    list_filter = ["status", "kind", "guarantee"]
    search_fields = ["=id", "=agent__id", "agent__name"]
    list_select_related = ["agent"]
    actions = ["cancel"]
    access_namespace_field = "agent__namespace"

    @admin.action(description="Cancel (kills the process on the agent)", permissions=["cancel"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[AgentCommand]) -> None:
        for command in queryset.select_related("agent"):
            access.require(request.user, "exec", "agents", command.agent.namespace)
            services.command_cancel(command=command, actor=request.user)
        messages.success(request, f"asked to cancel {queryset.count()} command(s)")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        # The same right the REST API asks for to cancel a command (running commands on machines).
        return access.grants(request.user).anywhere("exec", "agents")
