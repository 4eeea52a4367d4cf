"""The secret store: encrypted at rest, resolved only where used, keys rotate, errors say what to do."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from graphene_sdk import SecretRef
from graphene_sdk.testing import World

from apps.core.errors import ValidationFailed
from apps.secrets.crypto import SecretUndecryptable
from apps.secrets.models import Secret
from apps.secrets.services import (
    SecretNotFound,
    secret_create,
    secret_delete,
    secret_refs_resolve,
    secret_resolve,
    secret_set,
)
from tests.secrets.pipelines import secret_in_a_spec

pytestmark = pytest.mark.django_db

PLAINTEXT = "correct horse battery staple"


def raw_row(name: str) -> str:
    """The secret's whole row as PostgreSQL sees it, every column as text."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT t::text FROM secrets_secret AS t WHERE name = %s", [name])
        row = cursor.fetchone()
    assert row is not None
    return str(row[0])


def test_the_value_is_encrypted_at_rest() -> None:
    secret_create(name="db-password", value=PLAINTEXT)
    row = raw_row("db-password")
    assert "db-password" in row  # the name is stored in clear; the value is not
    assert PLAINTEXT not in row
    assert "horse" not in row
    assert secret_resolve(name="db-password") == PLAINTEXT
    # Two stores of one value give different ciphertexts (random IV): nothing to compare.
    secret_create(name="again", value=PLAINTEXT)
    assert Secret.objects.get(name="db-password").ciphertext != Secret.objects.get(name="again").ciphertext


def test_a_missing_secret_is_named_with_how_to_create_it() -> None:
    with pytest.raises(SecretNotFound) as missing:
        secret_resolve(name="deploy-key")
    message = str(missing.value)
    assert "secret 'deploy-key' does not exist" in message
    assert 'POST /api/v1/secrets/ {"name": "deploy-key"' in message
    assert missing.value.status_code == 404


def test_keys_rotate_newest_first_and_a_lost_key_is_explained(settings: Any) -> None:
    settings.GRAPHENE_SECRETS_KEY = ["old-key-0123456789abcdef0123456789"]
    secret_create(name="token", value=PLAINTEXT)
    old_key_id = Secret.objects.get(name="token").key_id

    settings.GRAPHENE_SECRETS_KEY = ["new-key-fedcba9876543210fedcba9876", "old-key-0123456789abcdef0123456789"]
    assert secret_resolve(name="token") == PLAINTEXT  # the old key still decrypts
    secret_set(name="token", value=PLAINTEXT)  # re-saving moves it to the new key
    assert Secret.objects.get(name="token").key_id != old_key_id

    settings.GRAPHENE_SECRETS_KEY = ["new-key-fedcba9876543210fedcba9876"]
    assert secret_resolve(name="token") == PLAINTEXT

    settings.GRAPHENE_SECRETS_KEY = ["someone-elses-key-00000000000000000"]
    with pytest.raises(SecretUndecryptable, match="GRAPHENE_SECRETS_KEY=new,old"):
        secret_resolve(name="token")


def test_without_a_configured_key_it_is_derived_from_secret_key(settings: Any) -> None:
    settings.GRAPHENE_SECRETS_KEY = []
    secret_create(name="token", value=PLAINTEXT)
    assert secret_resolve(name="token") == PLAINTEXT
    settings.SECRET_KEY = "a-different-django-secret-key"
    with pytest.raises(SecretUndecryptable):
        secret_resolve(name="token")


def test_a_ciphertext_copied_onto_another_secret_does_not_decrypt() -> None:
    secret_create(name="admin-password", value="admin")
    secret_create(name="guest-password", value="guest")
    stolen = Secret.objects.get(name="admin-password").ciphertext
    Secret.objects.filter(name="guest-password").update(ciphertext=stolen)
    with pytest.raises(SecretUndecryptable, match="belongs to another secret"):
        secret_resolve(name="guest-password")


def test_set_creates_then_replaces_and_delete_removes() -> None:
    _, created = secret_set(name="k", value="1")
    _, created_again = secret_set(name="k", value="2")
    assert (created, created_again) == (True, False)
    assert secret_resolve(name="k") == "2"
    secret_delete(name="k")
    with pytest.raises(SecretNotFound):
        secret_delete(name="k")


def test_names_are_validated_in_the_service_too() -> None:
    with pytest.raises(ValidationFailed) as bad:
        secret_create(name="no spaces", value="v")
    assert bad.value.fields == {"name": [bad.value.fields["name"][0]]}
    with pytest.raises(ValueError, match="not a valid secret name"):
        SecretRef("no spaces")


def test_references_travel_as_names_and_resolve_at_the_point_of_use() -> None:
    secret_create(name="db-password", value=PLAINTEXT)
    world = World()
    result = world.run(secret_in_a_spec, {"secret": "db-password"})
    assert result.succeeded, result.error_text
    spec = world.record("db", include_deleted=True).spec  # the run ended: its records died with it
    assert spec == {"value": {"env": [{"name": "PGPASSWORD", "value": {"$secret": "db-password"}}]}}
    assert [line.message for line in result.logs] == ["db uses SecretRef(name='db-password')"]
    # A kind resolves the reference where it uses it; the spec itself keeps the name.
    assert secret_refs_resolve(spec) == {"value": {"env": [{"name": "PGPASSWORD", "value": PLAINTEXT}]}}
    assert spec["value"]["env"][0]["value"] == {"$secret": "db-password"}
    with pytest.raises(ValidationFailed):
        secret_refs_resolve({"$secret": "db-password", "other": 1})
