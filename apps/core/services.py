"""Installation-level writes: the first admin user, and API tokens (``graphene token``)."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction
from rest_framework.authtoken.models import Token

from apps.core.errors import NotFound, ValidationFailed


@dataclass(frozen=True)
class AdminCredentials:
    username: str
    password: str | None  # only known when this call created the user
    token: str
    created: bool
    path: Path


@transaction.atomic
def admin_bootstrap(*, data_dir: Path, username: str = "admin") -> AdminCredentials:
    """Create the first superuser and its API token unless a superuser already exists.

    The password and token are written to ``<data_dir>/admin-credentials.json`` (mode 0600)
    so that a later start can say where they are without printing the password again.
    """
    user_model = get_user_model()
    path = data_dir / "admin-credentials.json"
    existing = user_model.objects.filter(is_superuser=True).order_by("pk").first()
    if existing is not None:
        token, _ = Token.objects.get_or_create(user=existing)
        return AdminCredentials(existing.get_username(), None, token.key, False, path)
    password = secrets.token_urlsafe(18)
    user = user_model.objects.create_superuser(username=username, email="", password=password)
    token = Token.objects.create(user=user)
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"username": username, "password": password, "token": token.key}, indent=2))
    path.chmod(0o600)
    return AdminCredentials(username, password, token.key, True, path)


@dataclass(frozen=True)
class IssuedToken:
    username: str
    token: str
    created_user: bool  # this call created the user (no password: an API-only account)
    created_token: bool  # the user had no token before this call
    rotated: bool  # this call replaced the user's token: the previous one no longer authenticates


@transaction.atomic
def api_token_issue(*, username: str, create_user: bool = False, rotate: bool = False) -> IssuedToken:
    """The API token of user ``username``: the one it has, a new one if it has none, or with
    ``rotate`` a new one that replaces it. Idempotent without ``rotate``: a user has one token.

    ``create_user`` creates a missing user as an API-only account: active, not staff, with no
    usable password (it cannot log in to the Studio). The user's row is locked, so that two
    concurrent calls agree on one token.
    """
    user_model = get_user_model()
    user = user_model.objects.select_for_update().filter(**{user_model.USERNAME_FIELD: username}).first()
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
        created_user = True
    if not user.is_active:
        raise ValidationFailed(
            f"user {username!r} is inactive, and a token of an inactive user does not authenticate: "
            f"activate it first (the Studio's Users page)",
            fields={"username": ["inactive"]},
        )
    existing = Token.objects.filter(user=user).first()
    if existing is not None and not rotate:
        return IssuedToken(username, existing.key, created_user, False, False)
    if existing is not None:
        existing.delete()
    token = Token.objects.create(user=user)
    return IssuedToken(username, token.key, created_user, existing is None, existing is not None)
