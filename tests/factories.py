"""Records, role bindings and API tokens built through the services, as the product builds them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from apps.accounts import services as accounts
from apps.core import rbac
from apps.records import services
from apps.records.models import Record


def api_token(user: Any, *, expires_in: timedelta | None = None, comment: str = "test") -> str:
    """A new API token of ``user`` (the key, for ``Authorization: Token <key>``)."""
    return accounts.access_token_issue(user=user, expires_in=expires_in, comment=comment).key


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


def bind_namespace(name: str) -> None:
    """A namespace (as an admin would make it), if it does not exist yet."""
    from apps.core.models import Namespace

    Namespace.objects.get_or_create(name=name)
