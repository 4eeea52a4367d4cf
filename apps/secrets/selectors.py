"""Reads of the secret store: names and timestamps only (values are read by ``services.secret_resolve``)."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.core import access
from apps.records.selectors import User
from apps.secrets.models import Secret
from apps.secrets.services import DEFAULT_NAMESPACE, SecretNotFound


def secret_list(*, user: User, namespace: str | None = None) -> QuerySet[Secret]:
    """Secret names (never values) in the namespaces where ``user`` may ``read_secret_names``
    (``namespace``: only that one)."""
    qs = access.scope(Secret.objects.all(), user, "read_secret_names", "secrets")
    if namespace:
        qs = qs.filter(namespace=namespace)
    return qs.select_related("created_by", "updated_by").defer("ciphertext")


def secret_get(*, user: User, name: str, namespace: str = DEFAULT_NAMESPACE) -> Secret:
    secret = secret_list(user=user, namespace=namespace).filter(name=name).first()
    if secret is None:
        raise SecretNotFound(f"no secret {name!r} in namespace {namespace!r}")
    return secret
