"""Installation-level writes: the first admin user and API token."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth import get_user_model
from django.db import transaction
from rest_framework.authtoken.models import Token


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
