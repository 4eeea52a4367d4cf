"""The tokens of DRF's ``rest_framework.authtoken`` (plaintext keys that never expired) become
access tokens: the digest of each old key, expiring GRAPHENE_USER_TOKEN_TTL_DAYS from now, so
that a deployed graphenectl context or CI variable keeps working until then. Then the old table,
which holds the keys in plain text, is dropped, with authtoken's migration records (the app is
no longer installed; were it installed again, it would start from an empty table).

Read and dropped with SQL: ``rest_framework.authtoken`` is not an installed app any more, so its
model is not in the migration state. On a new installation there is no such table and this does
nothing.
"""

import hashlib
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import migrations
from django.utils import timezone
from django.utils.dateparse import parse_datetime

OLD_TABLE = "authtoken_token"


def _aware(value, default):
    """A row's timestamp as an aware datetime (SQLite may give text or a naive UTC value)."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if not isinstance(value, datetime):
        return default
    return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)


def import_drf_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if OLD_TABLE not in connection.introspection.table_names():
        return
    AccessToken = apps.get_model("accounts", "AccessToken")
    quoted = schema_editor.quote_name(OLD_TABLE)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {schema_editor.quote_name('key')}, user_id, created FROM {quoted}")  # noqa: S608
        rows = cursor.fetchall()
    now = timezone.now()
    expires_at = now + timedelta(days=settings.GRAPHENE_USER_TOKEN_TTL_DAYS)
    AccessToken.objects.bulk_create(
        [
            AccessToken(
                user_id=user_id,
                digest=hashlib.sha256(key.encode()).hexdigest(),
                prefix=key[:12],
                comment="imported from the earlier token scheme",
                created_at=_aware(created, now),
                expires_at=expires_at,
            )
            for key, user_id, created in rows
        ],
        ignore_conflicts=True,  # run again after a partial import: a digest is imported once
    )
    schema_editor.execute(f"DROP TABLE {quoted}")
    schema_editor.execute("DELETE FROM django_migrations WHERE app = %s", ["authtoken"])


class Migration(migrations.Migration):
    dependencies = [("accounts", "0001_service_accounts_and_access_tokens")]

    # Backwards: nothing to restore (the old keys are gone by design).
    operations = [migrations.RunPython(import_drf_tokens, migrations.RunPython.noop)]
