"""Reads shared by every app."""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Model, QuerySet

from apps.core import access
from apps.core.errors import NotFound
from apps.core.models import AuditEntry, Namespace, Role, RoleBinding
from apps.core.tls import CA_FILE, ca_file_read

M = TypeVar("M", bound=Model)


def get_by_uuid(queryset: QuerySet[M], raw_id: Any, *, noun: str) -> M:
    """One row of ``queryset`` by its UUID primary key; ``NotFound`` (404) saying why if not."""
    try:
        pk = uuid.UUID(str(raw_id))
    except ValueError:
        raise NotFound(f"no {noun} {raw_id!r}: {noun} ids are UUIDs") from None
    try:
        return queryset.get(pk=pk)
    except ObjectDoesNotExist:
        raise NotFound(f"no {noun} {raw_id}") from None


def namespace_list(*, user: Any) -> QuerySet[Namespace]:
    """The namespaces ``user`` holds a binding in (all of them with a binding in ``*``)."""
    bound = access.grants(user).bound_namespaces()
    qs = Namespace.objects.select_related("created_by")
    return qs if bound is None else qs.filter(name__in=sorted(bound))


def namespace_get(*, user: Any, name: str) -> Namespace:
    found = namespace_list(user=user).filter(name=name).first()
    if found is None:
        raise NotFound(f"no namespace {name!r}")
    return found


def role_list() -> QuerySet[Role]:
    return Role.objects.all()


def role_get(*, name: str) -> Role:
    found = Role.objects.filter(name=name).first()
    if found is None:
        raise NotFound(f"no role {name!r} (roles: {', '.join(Role.objects.values_list('name', flat=True))})")
    return found


def binding_list(*, user: Any, namespace: str | None = None, subject: str | None = None) -> QuerySet[RoleBinding]:
    """Bindings in the namespaces where ``user`` may list bindings, and their own anywhere."""
    from django.db.models import Q

    allowed = access.visible_namespaces(user, "list", "rolebindings")
    qs = RoleBinding.objects.select_related("role", "user", "group", "created_by")
    if allowed is not None:
        qs = qs.filter(Q(namespace__in=sorted(allowed)) | Q(user_id=user.pk))
    if namespace:
        qs = qs.filter(namespace=namespace)
    if subject:
        qs = qs.filter(user__username=subject)
    return qs


def audit_list(
    *,
    user: Any,
    namespace: str | None = None,
    actor: str | None = None,
    actor_kind: str | None = None,
    action: str | None = None,
    object_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    request_id: str | None = None,
) -> QuerySet[AuditEntry]:
    """The audit rows ``user`` may list (``list audit`` in their namespaces; the rows of
    installation-wide objects, in ``*``, only with a binding in ``*``), filtered:

    ``actor`` matches the actor's name or id (a username, ``pipeline#n``, a run's or an agent's
    id); ``action`` is one action (``record.create``) or, without a dot, a family
    (``secret``: every ``secret.*``); ``since`` inclusive, ``until`` exclusive."""
    from django.db.models import Q

    qs = access.scope(AuditEntry.objects.all(), user, "list", "audit")
    if namespace:
        qs = qs.filter(namespace=namespace)
    if actor:
        qs = qs.filter(Q(actor_name=actor) | Q(actor_id=actor))
    if actor_kind:
        qs = qs.filter(actor_kind=actor_kind)
    if action:
        qs = qs.filter(action=action) if "." in action else qs.filter(action__startswith=f"{action}.")
    if object_id:
        qs = qs.filter(object_id=object_id)
    if since is not None:
        qs = qs.filter(created_at__gte=since)
    if until is not None:
        qs = qs.filter(created_at__lt=until)
    if request_id:
        qs = qs.filter(request_id=request_id)
    return qs.order_by("-created_at", "-id")


def tls_ca_pem() -> str | None:
    """The CA certificate (PEM) clients and agents pin for this server: ``GRAPHENE_TLS_CA_FILE``,
    else the local CA of ``graphene up`` when the server uses it (no ``GRAPHENE_TLS_CERT_FILE``)
    and it exists; None for a certificate from a CA the machines already trust. Read at each
    call: ``graphene up`` makes its CA after the settings are loaded. ``TLSError`` when a
    configured file cannot be read."""
    if settings.GRAPHENE_TLS_CA_FILE:
        return ca_file_read(Path(settings.GRAPHENE_TLS_CA_FILE))
    local = Path(settings.GRAPHENE_TLS_DIR) / CA_FILE
    if settings.GRAPHENE_TLS_CERT_FILE or not local.exists():
        return None
    return ca_file_read(local)
