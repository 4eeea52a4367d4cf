"""Secrets over REST: shapes in and out. There is no output field for the value, by construction."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from graphene_sdk._secrets import SECRET_NAME
from rest_framework import serializers

from apps.api.strict import StrictInput
from apps.secrets.models import Secret
from apps.secrets.services import MAX_VALUE_BYTES


@extend_schema_field({"type": "string"})
class _Text(serializers.Field):
    """A JSON string, nothing else (DRF's CharField would turn 5 or true into "5", "True"),
    as it is: never trimmed (a private key's final newline is part of it). Emptiness and size
    are checked by the service, so the SDK and the API refuse the same things alike."""

    default_error_messages = {"invalid": "Not a valid string."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return data

    def to_representation(self, value: Any) -> str:
        return str(value)


# A value's bound is 64 KiB of UTF-8 (the service checks the bytes); the schema can only count
# characters, so it says at most as many characters as that many bytes.
@extend_schema_field({"type": "string", "minLength": 1, "maxLength": MAX_VALUE_BYTES, "writeOnly": True})
class _Value(_Text):
    pass


@extend_schema_field({"type": "string", "pattern": f"^{SECRET_NAME.pattern}$"})
class _Name(_Text):
    pass


class SecretCreateInput(StrictInput):
    name = _Name()
    value = _Value(write_only=True)


class SecretReplaceInput(StrictInput):
    value = _Value(write_only=True)


class SecretOutput(serializers.ModelSerializer[Secret]):
    created_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="username", read_only=True)
    updated_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Secret
        fields = ["name", "namespace", "created_at", "updated_at", "created_by", "updated_by", "key_id"]
        read_only_fields = fields
