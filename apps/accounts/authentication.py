"""The REST API's token authentication: ``Authorization: Token <key>`` or ``Bearer <key>``.

A key is looked up by its digest on every request (``services.access_token_authenticate``):
nothing caches it, so a revoked token is refused from the next request on. A refused token is
a 401 in the API's error shape whose ``detail`` says why (expired at, revoked at, account
deleted, user inactive) and what to do, with a code of its own (``token_expired``,
``token_revoked``, ``account_disabled``, ``user_inactive``; ``authentication_failed`` for a key
this server does not know).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from apps.accounts import services

SCHEMES = ("token", "bearer")


def presented_key(header: str) -> str | None:
    """The key of an ``Authorization`` header value (``Token <key>`` or ``Bearer <key>``, any
    case), or None when the header is of another scheme (``Basic``) or absent."""
    scheme, _, key = header.strip().partition(" ")
    if scheme.lower() not in SCHEMES:
        return None
    return key.strip()


class AccessTokenAuthentication(authentication.BaseAuthentication):
    """Authenticates a request by an API token; ``request.auth`` is its ``AccessToken``."""

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if isinstance(header, bytes):
            header = header.decode("latin-1")
        key = presented_key(header)
        if key is None:
            return None  # another scheme, or none: the session may still authenticate
        if not key or " " in key:
            raise exceptions.AuthenticationFailed(
                "the Authorization header must be 'Token <key>' or 'Bearer <key>', one key with no spaces"
            )
        try:
            token = services.access_token_authenticate(key=key)
        except services.TokenRefused as exc:
            raise exceptions.AuthenticationFailed(exc.detail, code=exc.code) from None
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Token realm="api"'


class AccessTokenScheme(OpenApiAuthenticationExtension):
    """How the schema describes the token (``components.securitySchemes.tokenAuth``)."""

    target_class = AccessTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        scheme: dict[str, Any] = build_bearer_security_scheme_object(
            header_name="Authorization",
            token_prefix="Token",  # noqa: S106 - the header's scheme word, not a password
        )
        scheme["description"] = "An API token: 'Token <key>' (or 'Bearer <key>'). Tokens expire; see /api/v1/tokens/."
        return scheme
