"""The Studio's view of secrets: names and timestamps only, read-only (values go in over the API)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.core import access
from apps.core.admin import AccessAdmin
from apps.secrets.models import Secret


@admin.register(Secret)
class SecretAdmin(AccessAdmin):
    access_resource = "secrets"

    list_display = ["name", "namespace", "key_id", "created_at", "updated_at", "created_by", "updated_by"]
    list_filter = ["namespace"]
    search_fields = ["name"]
    # The ciphertext is not shown either: it is of no use to a reader and need not travel.
    fields = ("name", "namespace", "key_id", "created_at", "updated_at", "created_by", "updated_by")
    readonly_fields = fields  # no writes here: they go through services.secret_delete and co. (the API)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return access.grants(request.user).anywhere("read_secret_names", "secrets")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is None:
            return self.has_module_permission(request)
        return access.may(request.user, "read_secret_names", "secrets", obj.namespace)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return access.scope(Secret.objects.all(), request.user, "read_secret_names", "secrets")
