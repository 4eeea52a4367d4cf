"""Every write of accounts and API tokens, and the one check of a presented token.

A key is made here, returned once (``IssuedToken.key``) and never stored, logged or put in an
event: only its SHA-256 digest and its first characters reach the database. A token is refused
(``TokenRefused``, a 401 saying why and what to do) the moment it is revoked, expires, or its
user is deactivated or its service account deleted: nothing caches a token's validity, and
revocation also closes the websockets it opened (``websocket_auth``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.accounts.models import AccessToken, ServiceAccount
from apps.core import audit, validation
from apps.core.errors import Conflict, GrapheneError, NotFound, ValidationFailed
from apps.core.events import publish_on_commit

logger = logging.getLogger(__name__)

Actor = AbstractBaseUser | AnonymousUser | None

DEFAULT_NAMESPACE = "default"
# Keys read ``grt_<43 characters>``: the prefix tells a secret scanner (and a person) what it is.
KEY_PREFIX = "grt_"
# What a list shows of a key: ``grt_`` and 8 random characters (48 bits: tokens are told apart,
# and the other 35 characters, over 200 bits, stay secret).
VISIBLE_CHARS = 12
# ``last_used_at`` is written at most this often per token: a busy client costs no write per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)
MAX_COMMENT = 200
MAX_DESCRIPTION = 500
# A presented key longer than this is no key of ours: refused without hashing it.
MAX_KEY_LENGTH = 200
# Service accounts' users are named so that no person's user can be: Django's username rule
# refuses ':' (createsuperuser, the Studio, ``graphene token --create-user``), as Kubernetes names them.
SERVICE_ACCOUNT_USERNAME = "system:serviceaccount:{namespace}:{name}"


class TokenRefused(GrapheneError):
    """A presented token that does not authenticate; ``detail`` says why and what to do."""

    status_code = 401
    code = "authentication_failed"


class IssuedToken(NamedTuple):
    """A new token and its key. The key exists only here: show it once and drop it."""

    token: AccessToken
    key: str


def token_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def token_group(token_id: Any) -> str:
    """The channel group of the websockets a token opened: revocation tells them to close."""
    return f"token.{getattr(token_id, 'hex', token_id)}"


def _iso(at: datetime) -> str:
    """An instant as refusals and ``graphene token`` show it: ISO 8601, UTC, to the second."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _actor_id(actor: Actor) -> Any:
    return actor.pk if actor is not None and actor.is_authenticated else None


def _days(days: int) -> str:
    return f"{days} day" if days == 1 else f"{days} days"


def token_lifetime(*, expires_in: timedelta | None, default_days: int) -> timedelta:
    """How long a new token lives: ``expires_in`` (1 second to ``GRAPHENE_TOKEN_MAX_TTL_DAYS``),
    or ``default_days`` when none is given. There is no token without an expiry."""
    if expires_in is None:
        return timedelta(days=default_days)
    longest = timedelta(days=settings.GRAPHENE_TOKEN_MAX_TTL_DAYS)
    if not timedelta(seconds=1) <= expires_in <= longest:
        message = (
            f"must be between 1 second and {_days(settings.GRAPHENE_TOKEN_MAX_TTL_DAYS)} (GRAPHENE_TOKEN_MAX_TTL_DAYS)"
        )
        raise ValidationFailed(f"expires_in {message}", fields={"expires_in_seconds": [message]})
    return expires_in


def _comment(comment: Any) -> str:
    if not isinstance(comment, str):
        raise ValidationFailed("comment must be a string", fields={"comment": ["must be a string"]})
    validation.check_text(comment, field="comment")
    if len(comment) > MAX_COMMENT:
        message = f"has {len(comment)} characters; at most {MAX_COMMENT}"
        raise ValidationFailed(f"comment {message}", fields={"comment": [message]})
    return comment


def how_to_renew(user: Any) -> str:
    """What the holder of a refused token does next, said in the refusal."""
    account = _service_account_of(user)
    if account is not None:
        return (
            f"an administrator issues a new one with "
            f"`graphenectl account token {account.name} --namespace {account.namespace}`"
        )
    return (
        f"create a new one with `graphene token {user.get_username()}` on the server, "
        f"or `graphenectl token create` with a token that still works"
    )


def _service_account_of(user: Any) -> ServiceAccount | None:
    try:
        account: ServiceAccount = user.service_account
    except ServiceAccount.DoesNotExist:
        return None
    return account


# --- the audit trail -------------------------------------------------------------------------------
# Every write here leaves its row (apps/core/audit.py). A service account's tokens are in its
# namespace; a person's tokens and users are installation-wide (``*``), as the access module
# reads them. Never a key, nor its digest: a token's row names it by its first characters only.


def _account_audited(account: ServiceAccount) -> dict[str, Any]:
    return {
        "namespace": account.namespace,
        "name": account.name,
        "description": account.description,
        "username": SERVICE_ACCOUNT_USERNAME.format(namespace=account.namespace, name=account.name),
        "disabled_at": account.disabled_at,
    }


def _audit_account(
    action: str, account: ServiceAccount, *, actor: Actor, before: Any, after: Any, **detail: Any
) -> None:
    audit.audit_write(
        action=action,
        resource="accounts",
        object_id=account.pk,
        object_name=account.name,
        namespace=account.namespace,
        before=before,
        after=after,
        detail=detail,
        actor=actor,
    )


def _token_audited(token: AccessToken, username: str) -> dict[str, Any]:
    """What the digests cover of a token: never its key or the key's digest."""
    return {
        "id": token.pk,
        "user": username,
        "prefix": token.prefix,
        "comment": token.comment,
        "created_at": token.created_at,
        "expires_at": token.expires_at,
        "revoked_at": token.revoked_at,
        "revoked_reason": token.revoked_reason,
    }


def _token_change(
    action: str, token: AccessToken, *, user: Any, before: Any, after: Any, **detail: Any
) -> audit.Change:
    username = user.get_username()
    account = _service_account_of(user)
    return audit.Change(
        action=action,
        resource="accounts",
        object_id=token.pk,
        object_name=f"{token.prefix}… of {username}",
        namespace=account.namespace if account is not None else audit.EVERYWHERE,
        before=before,
        after=after,
        detail={"user": username, **detail},
    )


def _audit_user_created(user: Any, **detail: Any) -> None:
    """A user the ``graphene`` command made (the first admin, ``--create-user``), as the
    Studio's users' page records one."""
    audit.audit_write(
        action="user.create",
        resource="users",
        object_id=user.pk,
        object_name=user.get_username(),
        namespace=audit.EVERYWHERE,
        after=audit.user_fields(user),
        detail=detail,
    )


# --- issuing and revoking --------------------------------------------------------------------------


def _create(*, user: Any, lifetime: timedelta, comment: str, actor: Actor, now: datetime) -> IssuedToken:
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    token = AccessToken.objects.create(
        user=user,
        digest=token_digest(key),
        prefix=key[:VISIBLE_CHARS],
        comment=comment,
        created_by_id=_actor_id(actor),
        created_at=now,
        expires_at=now + lifetime,
    )
    after = _token_audited(token, user.get_username())
    change = _token_change("token.create", token, user=user, before=None, after=after, expires_at=token.expires_at)
    audit.audit_write_many([change], actor=actor)
    return IssuedToken(token, key)


# Row locks here are FOR NO KEY UPDATE: they serialize writers of the row (two revocations, an
# issue racing a deactivation) without blocking inserts that reference it (a record a user creates).
@transaction.atomic
def access_token_issue(
    *,
    user: Any,
    expires_in: timedelta | None = None,
    comment: str = "",
    actor: Actor = None,
    default_days: int | None = None,
) -> IssuedToken:
    """A new token for ``user``, valid ``expires_in`` (default: the user's TTL,
    ``GRAPHENE_USER_TOKEN_TTL_DAYS``). The key is in the result only."""
    comment = _comment(comment)
    lifetime = token_lifetime(expires_in=expires_in, default_days=default_days or settings.GRAPHENE_USER_TOKEN_TTL_DAYS)
    user = get_user_model().objects.select_for_update(no_key=True).get(pk=user.pk)
    if not user.is_active:
        raise Conflict(
            f"user {user.get_username()!r} is inactive, and an inactive user's token does not authenticate: "
            f"activate it first (the Studio's Users page)",
            fields={"user": ["inactive"]},
        )
    account = _service_account_of(user)
    if account is not None and account.is_disabled:
        raise Conflict(f"{account} was deleted at {_iso(account.disabled_at)}; it gets no new tokens")  # type: ignore[arg-type]  # is_disabled: set
    issued = _create(user=user, lifetime=lifetime, comment=comment, actor=actor, now=timezone.now())
    logger.info(
        "token %s issued to %s by %s, expires %s",
        issued.token.prefix,
        user.get_username(),
        _actor_id(actor),
        _iso(issued.token.expires_at),
    )
    return issued


def _announce_revoked(tokens: list[tuple[Any, str]], reason: str) -> None:
    for token_id, prefix in tokens:
        publish_on_commit(token_group(token_id), {"event": "token.revoked", "reason": reason, "token": prefix})


@transaction.atomic
def access_token_revoke(*, token: AccessToken, actor: Actor = None, reason: str = "revoked") -> AccessToken:
    """Revoke one token: it is refused from the next request on, and the websockets it opened
    are closed. Revoking a revoked token changes nothing (its first revocation stands)."""
    token = AccessToken.objects.select_for_update(no_key=True).get(pk=token.pk)
    if token.revoked_at is not None:
        return token
    username = token.user.get_username()
    before = _token_audited(token, username)
    token.revoked_at = timezone.now()
    token.revoked_reason = reason[:200]
    token.save(update_fields=["revoked_at", "revoked_reason"])
    after = _token_audited(token, username)
    change = _token_change("token.revoke", token, user=token.user, before=before, after=after, reason=reason[:200])
    audit.audit_write_many([change], actor=actor)
    _announce_revoked([(token.pk, token.prefix)], token.revoked_reason)
    logger.info("token %s of user %s revoked by %s: %s", token.prefix, token.user_id, _actor_id(actor), reason)
    return token


@transaction.atomic
def access_tokens_revoke_all(*, user: Any, actor: Actor = None, reason: str = "revoked") -> int:
    """Revoke every live token of ``user``; how many were revoked."""
    live = AccessToken.objects.select_for_update(no_key=True).filter(user=user, revoked_at__isnull=True)
    found = list(live.defer("digest").order_by("created_at", "pk"))
    if not found:
        return 0
    now, reason = timezone.now(), reason[:200]
    AccessToken.objects.filter(pk__in=[t.pk for t in found]).update(revoked_at=now, revoked_reason=reason)
    username, changes = user.get_username(), []
    for token in found:
        before = _token_audited(token, username)
        token.revoked_at, token.revoked_reason = now, reason
        after = _token_audited(token, username)
        changes.append(_token_change("token.revoke", token, user=user, before=before, after=after, reason=reason))
    audit.audit_write_many(changes, actor=actor)
    _announce_revoked([(t.pk, t.prefix) for t in found], reason)
    logger.info("%d token(s) of user %s revoked by %s: %s", len(found), user.pk, _actor_id(actor), reason)
    return len(found)


# --- authentication --------------------------------------------------------------------------------


def token_refusal(token: AccessToken, *, now: datetime | None = None) -> TokenRefused | None:
    """Why ``token`` (its user and service account loaded) does not authenticate now, or None."""
    now = now or timezone.now()
    user = token.user
    shown = f"this token ({token.prefix}…)"
    if token.revoked_at is not None:
        why = f" ({token.revoked_reason})" if token.revoked_reason else ""
        return TokenRefused(
            f"{shown} was revoked at {_iso(token.revoked_at)}{why}; {how_to_renew(user)}", code="token_revoked"
        )
    if token.expires_at <= now:
        return TokenRefused(f"{shown} expired at {_iso(token.expires_at)}; {how_to_renew(user)}", code="token_expired")
    account = _service_account_of(user)
    if account is not None and account.disabled_at is not None:
        return TokenRefused(
            f"{shown} belongs to {account}, which was deleted at {_iso(account.disabled_at)}",
            code="account_disabled",
        )
    if not user.is_active:
        return TokenRefused(
            f"{shown} belongs to user {user.get_username()!r}, which is inactive: an administrator can "
            f"activate it again (the Studio's Users page)",
            code="user_inactive",
        )
    return None


def access_token_authenticate(*, key: str) -> AccessToken:
    """The token whose key was presented, with its user loaded, if it authenticates now; else
    ``TokenRefused`` saying why. Records the use (at most once a minute per token)."""
    token = None
    if 0 < len(key) <= MAX_KEY_LENGTH:
        token = (
            AccessToken.objects.select_related("user", "user__service_account").filter(digest=token_digest(key)).first()
        )
    if token is None:
        raise TokenRefused(
            "this token is not known to this server (copied in part, or from another server?): "
            "`graphene token USERNAME` on the server issues one"
        )
    now = timezone.now()
    refusal = token_refusal(token, now=now)
    if refusal is not None:
        raise refusal
    if token.last_used_at is None or token.last_used_at <= now - LAST_USED_RESOLUTION:
        # Conditional: of several requests in the same minute, one writes.
        stale = Q(last_used_at__isnull=True) | Q(last_used_at__lte=now - LAST_USED_RESOLUTION)
        AccessToken.objects.filter(stale, pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def access_token_recheck(*, token_id: Any) -> TokenRefused | None:
    """Why a token that authenticated a long-lived connection no longer does, or None: the
    database is asked again (a lost revocation message must not keep a socket open)."""
    token = AccessToken.objects.select_related("user", "user__service_account").filter(pk=token_id).first()
    if token is None:
        return TokenRefused("this token no longer exists", code="token_revoked")
    return token_refusal(token)


# --- service accounts --------------------------------------------------------------------------------


def namespace_validate(namespace: Any, *, field: str = "namespace") -> str:
    """A namespace's name (a DNS label, as the access module names namespaces), or ``ValidationFailed``."""
    return validation.check_dns_label(namespace, field=field)


def service_account_create(
    *, name: Any, namespace: str = DEFAULT_NAMESPACE, description: Any = "", actor: Actor = None
) -> ServiceAccount:
    """A new service account and its user (no password, not staff). ``Conflict`` if the name is
    taken in the namespace, by a live account or a deleted one (names are not reused)."""
    name = validation.check_dns_label(name, field="name")
    namespace = namespace_validate(namespace)
    if not isinstance(description, str):
        raise ValidationFailed("description must be a string", fields={"description": ["must be a string"]})
    validation.check_text(description, field="description")
    if len(description) > MAX_DESCRIPTION:
        message = f"has {len(description)} characters; at most {MAX_DESCRIPTION}"
        raise ValidationFailed(f"description {message}", fields={"description": [message]})
    existing = ServiceAccount.objects.filter(namespace=namespace, name=name).first()
    if existing is not None:
        raise _taken(existing)
    user_model = get_user_model()
    username = SERVICE_ACCOUNT_USERNAME.format(namespace=namespace, name=name)
    try:
        with transaction.atomic():
            user = user_model(**{user_model.USERNAME_FIELD: username}, is_staff=False, is_superuser=False)
            user.set_unusable_password()
            user.save()
            account = ServiceAccount.objects.create(
                namespace=namespace,
                name=name,
                description=description,
                user=user,
                created_by_id=_actor_id(actor),
                created_at=timezone.now(),
            )
            _audit_account(
                "account.create", account, actor=actor, before=None, after=_account_audited(account), username=username
            )
    except IntegrityError:  # created concurrently
        existing = ServiceAccount.objects.filter(namespace=namespace, name=name).first()
        taken = Conflict(
            f"a user named {username!r} exists and is no service account: choose another name",
            fields={"name": ["taken by a user"]},
        )
        raise (_taken(existing) if existing else taken) from None
    logger.info("%s created by %s", account, _actor_id(actor))
    return account


def _taken(existing: ServiceAccount) -> Conflict:
    if existing.disabled_at is not None:
        return Conflict(
            f"{existing} was deleted at {_iso(existing.disabled_at)}, and names are not reused (what was granted "
            f"to it by name must not pass to a new account): choose another name",
            fields={"name": ["taken by a deleted account"]},
        )
    return Conflict(f"{existing} already exists", fields={"name": ["already exists"]})


@transaction.atomic
def service_account_delete(*, account: ServiceAccount, actor: Actor = None) -> tuple[ServiceAccount, int]:
    """Delete (disable) a service account: its user is deactivated and every token revoked at
    once. The row stays, so that what it did stays attributed. Returns it and how many tokens
    were revoked; deleting it again changes nothing."""
    account = ServiceAccount.objects.select_for_update(no_key=True).select_related("user").get(pk=account.pk)
    if account.disabled_at is not None:
        return account, 0
    before = _account_audited(account)
    account.disabled_at = timezone.now()
    account.save(update_fields=["disabled_at"])
    user = account.user
    user.is_active = False
    user.save(update_fields=["is_active"])
    revoked = access_tokens_revoke_all(user=user, actor=actor, reason="the service account was deleted")
    _audit_account(
        "account.delete", account, actor=actor, before=before, after=_account_audited(account), revoked_tokens=revoked
    )
    logger.info("%s deleted by %s (%d token(s) revoked)", account, _actor_id(actor), revoked)
    return account, revoked


def service_account_token_issue(
    *, account: ServiceAccount, expires_in: timedelta | None = None, comment: str = "", actor: Actor = None
) -> IssuedToken:
    """A new token of a service account (default lifetime ``GRAPHENE_SERVICE_ACCOUNT_TOKEN_TTL_DAYS``)."""
    if account.disabled_at is not None:
        raise Conflict(f"{account} was deleted at {_iso(account.disabled_at)}; it gets no new tokens")
    return access_token_issue(
        user=account.user,
        expires_in=expires_in,
        comment=comment,
        actor=actor,
        default_days=settings.GRAPHENE_SERVICE_ACCOUNT_TOKEN_TTL_DAYS,
    )


# --- the graphene command: the first admin and a user's token ----------------------------------------


@dataclass(frozen=True)
class UserToken:
    """What ``graphene token`` did: the key (shown once) and what else changed."""

    username: str
    token: str
    id: str
    expires_at: str
    comment: str
    created_user: bool  # this call created the user (no password: an API-only account)
    revoked: int  # with ``rotate``: the user's earlier tokens revoked by this call


@transaction.atomic
def user_token_issue(
    *,
    username: str,
    create_user: bool = False,
    rotate: bool = False,
    expires_in: timedelta | None = None,
    comment: str = "",
) -> UserToken:
    """A new token of user ``username`` (each call issues another; keys are not kept, so an
    earlier one cannot be shown again). ``rotate`` revokes the user's other tokens.

    ``create_user`` creates a missing user as an API-only account: active, not staff, with no
    usable password (it cannot log in to the Studio). Service accounts' users are refused: their
    tokens are issued with ``graphenectl account token``.
    """
    user_model = get_user_model()
    user = user_model.objects.select_for_update(no_key=True).filter(**{user_model.USERNAME_FIELD: username}).first()
    created_user = False
    if user is None:
        if not create_user:
            raise NotFound(
                f"no user {username!r}: create one with 'graphene manage createsuperuser', "
                f"or pass --create-user for an API-only account"
            )
        user = user_model(**{user_model.USERNAME_FIELD: username})
        user.set_unusable_password()
        try:
            user.full_clean()
        except ValidationError as exc:
            fields = {name: [str(m) for m in messages] for name, messages in exc.message_dict.items()}
            summary = "; ".join(" ".join(messages) for messages in fields.values())
            raise ValidationFailed(f"cannot create user {username!r}: {summary}", fields=fields) from None
        user.save()
        _audit_user_created(user, api_only=True)
        created_user = True
    account = _service_account_of(user)
    if account is not None:
        raise ValidationFailed(
            f"{username!r} is {account}: issue its tokens with "
            f"`graphenectl account token {account.name} --namespace {account.namespace}`",
            fields={"username": ["a service account"]},
        )
    if not user.is_active:
        raise ValidationFailed(
            f"user {username!r} is inactive, and a token of an inactive user does not authenticate: "
            f"activate it first (the Studio's Users page)",
            fields={"username": ["inactive"]},
        )
    revoked = access_tokens_revoke_all(user=user, reason="replaced by graphene token --rotate") if rotate else 0
    issued = access_token_issue(user=user, expires_in=expires_in, comment=comment)
    return UserToken(
        username=username,
        token=issued.key,
        id=str(issued.token.pk),
        expires_at=_iso(issued.token.expires_at),
        comment=issued.token.comment,
        created_user=created_user,
        revoked=revoked,
    )


@dataclass(frozen=True)
class AdminCredentials:
    username: str
    password: str | None  # only known when this call created the user
    token: str | None  # only known when this call issued it
    created: bool
    path: Path
    token_expires_at: str | None = None
    renewed: bool = False  # the saved token no longer authenticated: a new one replaced it in the file


@transaction.atomic
def admin_bootstrap(*, data_dir: Path, username: str = "admin") -> AdminCredentials:
    """Create the first superuser and an API token unless a superuser already exists.

    The password and token are written to ``<data_dir>/admin-credentials.json`` (mode 0600) so
    that a later start can say where they are without printing the password again. A later
    start whose saved token no longer authenticates (it expired) issues a new one into the
    file: the file is how an embedded installation's owner gets in.
    """
    user_model = get_user_model()
    path = data_dir / "admin-credentials.json"
    existing = user_model.objects.filter(is_superuser=True, is_active=True).order_by("pk").first()
    if existing is not None:
        return _admin_token_renew(user=existing, path=path)
    password = secrets.token_urlsafe(18)
    user = user_model.objects.create_superuser(username=username, email="", password=password)
    _audit_user_created(user, first_admin=True)
    issued = access_token_issue(user=user, comment="the first admin's, saved in admin-credentials.json")
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"username": username, "password": password, "token": issued.key}, indent=2))
    path.chmod(0o600)
    return AdminCredentials(username, password, issued.key, True, path, _iso(issued.token.expires_at))


def _admin_token_renew(*, user: Any, path: Path) -> AdminCredentials:
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = None
    if not isinstance(saved, dict) or saved.get("username") != user.get_username():
        return AdminCredentials(user.get_username(), None, None, False, path)  # not ours to renew
    key = str(saved.get("token") or "")
    token = AccessToken.objects.select_related("user", "user__service_account").filter(digest=token_digest(key)).first()
    if token is not None and token.user_id == user.pk and token_refusal(token) is None:
        return AdminCredentials(user.get_username(), None, None, False, path, _iso(token.expires_at))
    issued = access_token_issue(user=user, comment="the first admin's, renewed in admin-credentials.json")
    path.write_text(json.dumps({**saved, "token": issued.key}, indent=2))
    path.chmod(0o600)
    return AdminCredentials(
        user.get_username(), None, issued.key, False, path, _iso(issued.token.expires_at), renewed=True
    )
