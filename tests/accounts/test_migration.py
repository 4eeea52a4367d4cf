"""An installation upgraded from DRF's plaintext tokens: each old key keeps working (a deployed
graphenectl context, a CI variable) as an access token that now expires, and the old table,
which held the keys in plain text, is gone."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import AccessToken

pytestmark = pytest.mark.django_db

OLD_KEY = "9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"  # DRF's format: 40 hex characters


def _make_the_old_table(user_id: int) -> None:
    """``authtoken_token`` as DRF's migrations left it, with one key, and its migration records."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created timestamptz NOT NULL, "
            "user_id integer NOT NULL UNIQUE REFERENCES auth_user (id))"
        )
        cursor.execute(
            "INSERT INTO authtoken_token VALUES (%s, %s, %s)", [OLD_KEY, timezone.now() - timedelta(days=400), user_id]
        )
        cursor.execute(
            "INSERT INTO django_migrations (app, name, applied) VALUES ('authtoken', '0001_initial', now()), "
            "('authtoken', '0004_alter_tokenproxy_options', now())"
        )


def _migrate(target: tuple[str, str]) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([target])


def test_an_old_drf_token_becomes_an_expiring_access_token(django_user_model: Any, settings: Any) -> None:
    settings.GRAPHENE_USER_TOKEN_TTL_DAYS = 30
    user = django_user_model.objects.create_user(username="legacy", password="pw")
    _migrate(("accounts", "0001_service_accounts_and_access_tokens"))
    _make_the_old_table(user.pk)

    _migrate(("accounts", "0002_import_drf_tokens"))

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {OLD_KEY}")
    who = api.get("/api/v1/whoami/")
    assert who.status_code == 200, who.content
    assert who.json()["username"] == "legacy"
    token = AccessToken.objects.get(user=user)
    assert token.prefix == OLD_KEY[:12]
    assert token.comment == "imported from the earlier token scheme"
    assert timedelta(days=29, hours=23) < token.expires_at - timezone.now() <= timedelta(days=30)
    assert timedelta(days=399) < timezone.now() - token.created_at < timedelta(days=401)

    # Nothing holds the old key in plain text any more.
    assert "authtoken_token" not in connection.introspection.table_names()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_migrations WHERE app = 'authtoken'")
        assert cursor.fetchone() == (0,)
        cursor.execute("SELECT * FROM accounts_accesstoken")
        assert OLD_KEY not in repr(cursor.fetchall())

    # Expiry applies to it as to any token.
    AccessToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert api.get("/api/v1/whoami/").json()["error"] == "token_expired"


def test_without_the_old_table_the_migration_does_nothing(django_user_model: Any) -> None:
    _migrate(("accounts", "0001_service_accounts_and_access_tokens"))
    _migrate(("accounts", "0002_import_drf_tokens"))
    assert not AccessToken.objects.exists()
