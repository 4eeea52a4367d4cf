"""Accounts and tokens over REST: shapes in and out. A key appears in one shape only,
``IssuedTokenOutput``, the answer to the request that created it."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from graphene_sdk.validation import DNS_LABEL
from rest_framework import serializers

from apps.accounts.choices import TokenStatus
from apps.accounts.models import AccessToken, ServiceAccount
from apps.accounts.services import MAX_COMMENT, MAX_DESCRIPTION
from apps.api.params import StrictInteger
from apps.api.strict import StrictInput

DNS_LABEL_PATTERN = f"^{DNS_LABEL.pattern}$"


class _Text(serializers.Field):
    """A JSON string as it is (DRF's CharField would turn 5 into "5" and trim blanks); the
    service checks its length and that it can be stored, for every way in alike."""

    default_error_messages = {"invalid": "Not a valid string."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return data

    def to_representation(self, value: Any) -> str:
        return str(value)


@extend_schema_field({"type": "string", "pattern": DNS_LABEL_PATTERN})
class _Name(_Text):
    pass


@extend_schema_field({"type": "string", "maxLength": MAX_DESCRIPTION})
class _Description(_Text):
    pass


@extend_schema_field({"type": "string", "maxLength": MAX_COMMENT})
class _Comment(_Text):
    pass


def max_expires_in_seconds() -> int:
    return int(settings.GRAPHENE_TOKEN_MAX_TTL_DAYS) * 86400


class _ExpiresIn(StrictInteger):
    """Seconds, a JSON integer, 1 to ``GRAPHENE_TOKEN_MAX_TTL_DAYS`` days (read when the schema is made)."""

    def __init__(self, **kwargs: Any) -> None:
        days = int(settings.GRAPHENE_TOKEN_MAX_TTL_DAYS)
        messages: dict[str, Any] = {
            "max_value": f"at most {{max_value}} seconds ({days} days, GRAPHENE_TOKEN_MAX_TTL_DAYS): "
            "every token expires",
            "min_value": "at least {min_value} second",
        }
        super().__init__(min_value=1, max_value=max_expires_in_seconds(), error_messages=messages, **kwargs)


class ServiceAccountCreateInput(StrictInput):
    name = _Name(help_text="a DNS label: 1-63 lowercase letters, digits or '-'")
    description = _Description(required=False, default="")


class TokenCreateInput(StrictInput):
    expires_in_seconds = _ExpiresIn(
        required=False,
        help_text="how long the token is valid, in seconds (default: GRAPHENE_USER_TOKEN_TTL_DAYS days for a "
        "user's own token, GRAPHENE_SERVICE_ACCOUNT_TOKEN_TTL_DAYS for a service account's)",
    )
    comment = _Comment(required=False, default="", help_text="what the token is for")


class ServiceAccountOutput(serializers.ModelSerializer[ServiceAccount]):
    username = serializers.CharField(source="user.username", read_only=True, help_text="its user, for role bindings")
    created_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    live_tokens = serializers.IntegerField(read_only=True, help_text="tokens neither expired nor revoked")

    class Meta:
        model = ServiceAccount
        fields = ["name", "namespace", "description", "username", "created_at", "created_by", "disabled_at"]
        fields += ["live_tokens"]
        read_only_fields = fields


class ServiceAccountDeleteOutput(serializers.Serializer[Any]):
    account = ServiceAccountOutput()
    revoked_tokens = serializers.IntegerField(help_text="tokens this deletion revoked")


class RevokedCountOutput(serializers.Serializer[Any]):
    revoked_tokens = serializers.IntegerField(help_text="tokens this request revoked")


class _TokenStatus(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=TokenStatus.choices, source="*", read_only=True, **kwargs)

    def to_representation(self, token: Any) -> str:  # source="*": the whole AccessToken
        if token.revoked_at is not None:
            return TokenStatus.REVOKED.value
        return (TokenStatus.EXPIRED if token.expires_at <= timezone.now() else TokenStatus.ACTIVE).value


class TokenOutput(serializers.ModelSerializer[AccessToken]):
    """A token as lists show it: its first characters, never its key."""

    created_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    status = _TokenStatus(help_text="active, expired or revoked")

    class Meta:
        model = AccessToken
        fields = ["id", "prefix", "comment", "status", "created_at", "created_by", "expires_at", "last_used_at"]
        fields += ["revoked_at", "revoked_reason"]
        read_only_fields = fields


class IssuedTokenOutput(TokenOutput):
    """A new token with its key: the only answer that carries it. Keep it now; it is not stored."""

    key = serializers.SerializerMethodField(help_text="the token itself: send it as 'Authorization: Token <key>'")

    class Meta(TokenOutput.Meta):
        fields = ["key", *TokenOutput.Meta.fields]
        read_only_fields = fields

    def get_key(self, token: AccessToken) -> str:
        return str(self.context["key"])
