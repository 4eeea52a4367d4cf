"""Reads of accounts and tokens, and the one authorization decision about them (``account_authorize``)."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from apps.accounts.models import AccessToken, ServiceAccount
from apps.core import access
from apps.core.errors import NotFound

# What may be done, by whom (``account_authorize``). Verbs on service accounts and their tokens,
# and ``own.*`` on the caller's own tokens.
Verb = Literal[
    "list",
    "get",
    "create",
    "delete",
    "token.list",
    "token.create",
    "token.revoke",
    "own.list",
    "own.create",
    "own.revoke",
]


# The access module's verb on ``accounts`` for each verb here: reading an account's tokens is
# reading the account; issuing or revoking one changes what the account can do (``update``).
ACCESS_VERBS: dict[str, str] = {
    "list": "list",
    "get": "get",
    "create": "create",
    "delete": "delete",
    "token.list": "get",
    "token.create": "update",
    "token.revoke": "update",
}


def account_authorize(*, user: Any, verb: Verb, namespace: str | None) -> None:
    """The one authorization decision of accounts and tokens: returns, or raises ``AccessDenied``
    (403) saying which binding is missing.

    Service accounts and their tokens are the namespaced resource ``accounts`` of the access
    module (``apps.core.access``): the built-in ``admin`` role grants it in the namespace it is
    bound in (superusers everywhere); ``developer`` and ``viewer`` do not. A user's own tokens
    belong to no namespace: any active user lists and revokes its own tokens, and creates them
    unless it is a service account (a leaked service-account token must not mint its own
    successors: an administrator issues them, each with its expiry).
    """
    if not (user is not None and user.is_authenticated and user.is_active):
        raise access.AccessDenied("this needs an authenticated, active user")
    if verb.startswith("own."):
        if verb == "own.create" and hasattr(user, "service_account"):
            raise access.AccessDenied(
                "a service account does not create its own tokens: an administrator issues them with "
                "`graphenectl account token NAME`"
            )
        return
    access.require(user, ACCESS_VERBS[verb], "accounts", namespace)


def _live_tokens() -> Q:
    return Q(user__access_tokens__revoked_at__isnull=True, user__access_tokens__expires_at__gt=timezone.now())


def service_account_list(*, user: Any, namespace: str) -> QuerySet[ServiceAccount]:
    """The service accounts of ``namespace``, deleted ones too, each with ``live_tokens``."""
    account_authorize(user=user, verb="list", namespace=namespace)
    return (
        ServiceAccount.objects.filter(namespace=namespace)
        .select_related("user", "created_by")
        .annotate(live_tokens=Count("user__access_tokens", filter=_live_tokens()))
    )


def service_account_get(*, user: Any, name: str, namespace: str, verb: Verb = "get") -> ServiceAccount:
    """One service account by name (``NotFound`` saying where it was looked for)."""
    account_authorize(user=user, verb=verb, namespace=namespace)
    account = (
        ServiceAccount.objects.filter(namespace=namespace, name=name)
        .select_related("user", "created_by")
        .annotate(live_tokens=Count("user__access_tokens", filter=_live_tokens()))
        .first()
    )
    if account is None:
        raise NotFound(
            f"no service account {name!r} in namespace {namespace!r} "
            f"(`graphenectl account list --namespace {namespace}` lists them)"
        )
    return account


def _tokens() -> QuerySet[AccessToken]:
    return AccessToken.objects.select_related("created_by").defer("digest")


def service_account_token_list(*, user: Any, account: ServiceAccount) -> QuerySet[AccessToken]:
    account_authorize(user=user, verb="token.list", namespace=account.namespace)
    return _tokens().filter(user_id=account.user_id)


def _token_in(tokens: QuerySet[AccessToken], token_id: Any, where: str) -> AccessToken:
    try:
        pk = uuid.UUID(str(token_id))
    except ValueError:
        raise NotFound(f"no token {token_id!r} {where}: token ids are UUIDs") from None
    token = tokens.filter(pk=pk).first()
    if token is None:
        raise NotFound(f"no token {token_id} {where}")
    return token


def service_account_token_get(*, user: Any, account: ServiceAccount, token_id: Any) -> AccessToken:
    account_authorize(user=user, verb="token.list", namespace=account.namespace)
    return _token_in(_tokens().filter(user_id=account.user_id), token_id, f"of {account}")


def own_token_list(*, user: Any) -> QuerySet[AccessToken]:
    """The caller's own tokens (revoked and expired ones too, newest first)."""
    account_authorize(user=user, verb="own.list", namespace=None)
    return _tokens().filter(user_id=user.pk)


def own_token_get(*, user: Any, token_id: Any) -> AccessToken:
    """One of the caller's own tokens; another user's is not found (it is none of theirs)."""
    account_authorize(user=user, verb="own.list", namespace=None)
    return _token_in(_tokens().filter(user_id=user.pk), token_id, f"of user {user.get_username()!r}")
