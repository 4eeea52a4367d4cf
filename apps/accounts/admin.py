"""The Studio's view of service accounts and API tokens: read-only, never a key or a digest;
tokens can be revoked from their list (through the service, like every write)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.accounts import services
from apps.accounts.models import AccessToken, ServiceAccount

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:  # the stubs' generic is not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin


class _ReadOnly(_ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tokens and accounts are made over the API and graphenectl (a key is shown once, there)

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # a token is revoked, an account disabled: the rows stay to explain refusals


@admin.register(ServiceAccount)
class ServiceAccountAdmin(_ReadOnly):
    list_display = ["name", "namespace", "description", "created_at", "created_by", "disabled_at"]
    list_filter = ["namespace"]
    search_fields = ["name", "description"]
    fields = ("name", "namespace", "description", "user", "created_at", "created_by", "disabled_at")
    readonly_fields = fields


@admin.action(description="Revoke the selected tokens (refused from the next request on)")
def revoke_tokens(model_admin: Any, request: HttpRequest, queryset: QuerySet[AccessToken]) -> None:
    revoked = 0
    for token in queryset.filter(revoked_at__isnull=True):
        services.access_token_revoke(token=token, actor=request.user, reason="revoked in the Studio")
        revoked += 1
    model_admin.message_user(request, f"Revoked {revoked} token(s)", messages.SUCCESS)


@admin.register(AccessToken)
class AccessTokenAdmin(_ReadOnly):
    list_display = ["prefix", "user", "comment", "created_at", "expires_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "comment", "user__username"]
    list_select_related = ["user"]
    # No digest: of no use to a reader, and it need not travel.
    fields = (
        "prefix",
        "user",
        "comment",
        "created_at",
        "created_by",
        "expires_at",
        "last_used_at",
        "revoked_at",
        "revoked_reason",
    )
    readonly_fields = fields
    actions = [revoke_tokens]

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # The list's revoke action needs it; the form stays read-only (every field is).
        return bool(getattr(request.user, "is_superuser", False))
