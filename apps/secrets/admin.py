"""The Studio's view of secrets: names and timestamps only, read-only (values go in over the API)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.http import HttpRequest

from apps.secrets.models import Secret

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:  # the stubs' generic is not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin


@admin.register(Secret)
class SecretAdmin(_ModelAdmin):
    list_display = ["name", "namespace", "key_id", "created_at", "updated_at", "created_by", "updated_by"]
    list_filter = ["namespace"]
    search_fields = ["name"]
    # The ciphertext is not shown either: it is of no use to a reader and need not travel.
    fields = ("name", "namespace", "key_id", "created_at", "updated_at", "created_by", "updated_by")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # deletes go through services.secret_delete (the API), like every write
