"""The Studio's model pages ask the access module, as every other door does.

``AccessAdmin`` replaces Django's model permissions on a read-only ModelAdmin: the page is
reachable by whoever may ``get`` its resource in some namespace, and its rows are narrowed to
the namespaces where they may (``access_namespace_field`` names the row's namespace).

The users' and groups' pages are the Studio's only model pages that write: ``AuditedAdmin``
leaves an audit row for each of their writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.core import access, audit

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


def _users_rule(request: HttpRequest, verb: str) -> bool:
    return access.may(request.user, verb, "users", None)


class AuditedAdmin(_ModelAdmin):
    """A model page whose writes (add, change, delete) leave audit rows in their transactions:
    ``<audit_noun>.create|update|delete`` on the installation-wide resource ``users``.
    ``audited`` says which fields the digests cover (never a password)."""

    audit_noun = "user"
    # Users and groups are the installation-wide resource ``users``: who may see and change
    # them is a binding in ``*``'s to say; Django's model permissions play no part.
    access_resource = "users"

    # Each page says which fields its digests cover (never a password): UserAccessAdmin and
    # GroupAccessAdmin define it.
    audited: Callable[[Any], dict[str, Any]]

    def has_module_permission(self, request: HttpRequest) -> bool:
        return _users_rule(request, "get")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _users_rule(request, "get")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return _users_rule(request, "create")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _users_rule(request, "update")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _users_rule(request, "delete")

    @staticmethod
    def _remembered(request: HttpRequest) -> dict[Any, dict[str, Any]]:
        found: dict[Any, dict[str, Any]] = request.__dict__.setdefault("_graphene_audit_before", {})
        return found

    def _remember(self, request: HttpRequest, model: Any, pk: Any) -> None:
        """The object as it is in the database, before this request changes it."""
        fresh = model._default_manager.filter(pk=pk).first()
        if fresh is not None:
            self._remembered(request).setdefault(pk, self.audited(fresh))

    def _audit(self, request: HttpRequest, verb: str, obj: Any, *, after: bool = True, **detail: Any) -> None:
        audit.audit_write(
            action=f"{self.audit_noun}.{verb}",
            resource="users",
            object_id=obj.pk,
            object_name=str(obj),
            namespace=audit.EVERYWHERE,
            before=self._remembered(request).get(obj.pk) if verb != "create" else None,
            after=self.audited(obj) if after else None,
            detail={**request.__dict__.get("_graphene_audit_detail", {}), **detail},
            actor=request.user,
        )

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if change:
            self._remember(request, type(obj), obj.pk)
        super().save_model(request, obj, form, change)

    # Django calls these after the object and its relations are saved, inside the change view's
    # transaction: the digest covers the groups and permissions as saved.
    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        self._audit(request, "create", obj)
        return super().log_addition(request, obj, message)

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        self._audit(request, "update", obj)
        return super().log_change(request, obj, message)

    # A deletion's rows go with the deletion itself (the list's bulk action has no transaction
    # of its own: it gets one here).
    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        with transaction.atomic():
            self._remember(request, type(obj), obj.pk)
            self._audit(request, "delete", obj, after=False)
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        with transaction.atomic():
            for obj in queryset:
                self._remember(request, type(obj), obj.pk)
                self._audit(request, "delete", obj, after=False)
            super().delete_queryset(request, queryset)


class UserAccessAdmin(AuditedAdmin, UserAdmin):
    """People and service accounts' users (the rule: ``AuditedAdmin``'s)."""

    def audited(self, obj: Any) -> dict[str, Any]:
        return audit.user_fields(obj)  # as the graphene command's users are digested

    def user_change_password(self, request: HttpRequest, id: str, form_url: str = "") -> Any:
        """Django's page, in one transaction with its audit row: ``user.update`` with
        ``password_changed`` (the digests do not cover the password)."""
        if request.method != "POST":
            return super().user_change_password(request, id, form_url)
        with transaction.atomic():
            if str(id).isdigit():
                self._remember(request, self.model, int(id))
            request.__dict__["_graphene_audit_detail"] = {"password_changed": True}
            return super().user_change_password(request, id, form_url)


class GroupAccessAdmin(AuditedAdmin, GroupAdmin):
    """Groups (bindings may name one): the same rule as users."""

    audit_noun = "group"

    def audited(self, obj: Any) -> dict[str, Any]:
        permissions = sorted(obj.permissions.values_list("codename", flat=True)) if obj.pk else []
        return {"name": obj.name, "permissions": permissions}


for _model, _admin in ((User, UserAccessAdmin), (Group, GroupAccessAdmin)):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)
    admin.site.register(_model, _admin)
