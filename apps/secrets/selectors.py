"""Reads of the secret store: names and timestamps only (values are read by ``services.secret_resolve``)."""

from __future__ import annotations

from typing import Literal

from django.db.models import QuerySet
from rest_framework.exceptions import PermissionDenied

from apps.records.selectors import User
from apps.secrets.models import Secret
from apps.secrets.services import DEFAULT_NAMESPACE, SecretNotFound

Action = Literal["view", "add", "change", "delete"]


def secret_check_permission(*, user: User, action: Action) -> None:
    """The one authorization check of the secret store: Django's model permissions.

    Seeing the names needs ``secrets.view_secret``; storing, replacing and deleting need
    ``add``/``change``/``delete``. Nobody reads a value back over the API.
    """
    has_perm = getattr(user, "has_perm", None)  # AbstractBaseUser alone has no permissions
    permission = f"secrets.{action}_secret"
    if not (user.is_authenticated and has_perm is not None and has_perm(permission)):
        raise PermissionDenied(f"this needs the {permission} permission")


def secret_list(*, user: User, namespace: str = DEFAULT_NAMESPACE) -> QuerySet[Secret]:
    secret_check_permission(user=user, action="view")
    return Secret.objects.filter(namespace=namespace).select_related("created_by", "updated_by").defer("ciphertext")


def secret_get(*, user: User, name: str, namespace: str = DEFAULT_NAMESPACE) -> Secret:
    secret = secret_list(user=user, namespace=namespace).filter(name=name).first()
    if secret is None:
        raise SecretNotFound(f"no secret {name!r}")
    return secret
