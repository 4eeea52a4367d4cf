"""The Studio's view of agents: read-only tables; actions call services."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.agents import services
from apps.agents.models import Agent, AgentCommand, AgentToken

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:  # the stubs' generic is not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin


class ReadOnly(_ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Agent)
class AgentAdmin(ReadOnly):
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

    @admin.action(description="Revoke credentials (the agent must be bootstrapped again)")
    def revoke_credentials(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        for state in queryset.select_related("record"):
            services.agent_credentials_revoke(record=state.record, reason=f"revoked by {request.user}")
        messages.success(request, f"revoked the credentials of {queryset.count()} agent(s)")

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return bool(request.user.has_perm("agents.change_agent"))


@admin.register(AgentToken)
class AgentTokenAdmin(ReadOnly):
    list_display = ["agent", "kind", "prefix", "created_at", "expires_at", "used_at", "last_used_at", "revoked_at"]
    list_filter = ["kind"]
    search_fields = ["=agent__id", "agent__name", "prefix"]
    exclude = ["digest"]
    list_select_related = ["agent"]


@admin.register(AgentCommand)
class AgentCommandAdmin(ReadOnly):
    list_display = ["id", "agent", "kind", "status", "guarantee", "exit_code", "created_at", "finished_at"]
    list_filter = ["status", "kind", "guarantee"]
    search_fields = ["=id", "=agent__id", "agent__name"]
    list_select_related = ["agent"]
    actions = ["cancel"]

    @admin.action(description="Cancel (kills the process on the agent)")
    def cancel(self, request: HttpRequest, queryset: QuerySet[AgentCommand]) -> None:
        for command in queryset:
            services.command_cancel(command=command, actor=request.user)
        messages.success(request, f"asked to cancel {queryset.count()} command(s)")

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return bool(request.user.has_perm("agents.add_agentcommand"))
