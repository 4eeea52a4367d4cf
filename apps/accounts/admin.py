"""The Studio's view of service accounts and API tokens: read-only, never a key or a digest;
tokens can be revoked from their list (through the service, like every write). What a user sees
is what the access module lets it read of ``accounts``."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.accounts import selectors, services
from apps.accounts.models import AccessToken, ServiceAccount
from apps.core import access
from apps.core.admin import AccessAdmin


@admin.register(ServiceAccount)
class ServiceAccountAdmin(AccessAdmin):
    access_resource = "accounts"

    list_display = ["name", "namespace", "description", "created_at", "created_by", "disabled_at"]
    list_filter = ["namespace"]
    search_fields = ["name", "description"]
    fields = ("name", "namespace", "description", "user", "created_at", "created_by", "disabled_at")
    readonly_fields = fields


@admin.action(description="Revoke the selected tokens (refused from the next request on)")
def revoke_tokens(model_admin: Any, request: HttpRequest, queryset: QuerySet[AccessToken]) -> None:
    revoked, refused = 0, 0
    for token in queryset.filter(revoked_at__isnull=True).select_related("user__service_account"):
        account = getattr(token.user, "service_account", None)
        try:
            selectors.account_authorize(
                user=request.user, verb="token.revoke", namespace=account.namespace if account else None
            )
        except access.AccessDenied:
            refused += 1
            continue
        services.access_token_revoke(token=token, actor=request.user, reason="revoked in the Studio")
        revoked += 1
    model_admin.message_user(request, f"Revoked {revoked} token(s)", messages.SUCCESS)
    if refused:
        model_admin.message_user(request, f"{refused} token(s) are not yours to revoke", messages.WARNING)


@admin.register(AccessToken)
class AccessTokenAdmin(AccessAdmin):
    # A service account's tokens are read in its namespace; a person's tokens (no namespace) by
    # whoever may read accounts in every namespace.
    access_resource = "accounts"
    access_namespace_field = "user__service_account__namespace"

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
