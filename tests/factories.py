"""Records and API tokens built through the services, as the product builds them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from apps.accounts import services as accounts
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
