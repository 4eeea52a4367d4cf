"""Records built through the services, as the product builds them."""

from __future__ import annotations

from typing import Any

from apps.core import rbac
from apps.records import services
from apps.records.models import Record


def stand(name: str = "stand") -> Record:
    return services.record_create_root(kind="graphene.stand", name=name)


def run(name: str = "run") -> Record:
    return services.record_create_root(kind="graphene.run", name=name)


def sleep(owner: Record, name: str, **spec: Any) -> Record:
    return services.record_declare(kind="test.sleep", name=name, owner=owner, spec=spec)


def flaky(owner: Record, name: str, **spec: Any) -> Record:
    return services.record_declare(kind="test.flaky", name=name, owner=owner, spec=spec)


def bind(user: Any, role: str = "developer", namespace: str = "default") -> None:
    """Grant ``user`` a role in a namespace (made if missing), as an admin would."""
    from apps.core.models import Namespace

    if namespace != "*":
        Namespace.objects.get_or_create(name=namespace)
    rbac.role_bind(role=role, namespace=namespace, user=user.get_username(), actor=None)
