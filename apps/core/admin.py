"""The Studio's model pages ask the access module, as every other door does.

``AccessAdmin`` replaces Django's model permissions on a read-only ModelAdmin: the page is
reachable by whoever may ``get`` its resource in some namespace, and its rows are narrowed to
the namespaces where they may (``access_namespace_field`` names the row's namespace).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.core import access

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:  # the stubs' generic is not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin


class AccessAdmin(_ModelAdmin):
    """Read-only model pages whose rows are what the access module lets the user read."""

    access_resource = "records"
    access_namespace_field = "namespace"

    def _namespace_of(self, obj: Any) -> str | None:
        value: Any = obj
        for part in self.access_namespace_field.split("__"):
            value = getattr(value, part, None)
        return value if isinstance(value, str) else None

    def has_module_permission(self, request: HttpRequest) -> bool:
        return access.grants(request.user).anywhere("get", self.access_resource)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is None:
            return access.grants(request.user).anywhere("get", self.access_resource)
        return access.may(request.user, "get", self.access_resource, self._namespace_of(obj))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = super().get_queryset(request)
        return access.scope(qs, request.user, "get", self.access_resource, field=self.access_namespace_field)
