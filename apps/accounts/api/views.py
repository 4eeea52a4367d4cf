"""Service accounts and API tokens over REST: thin views — input serializer, selector (which
authorizes), one service call, output. A new key is in the create answer only (``no-store``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts import selectors, services
from apps.accounts.api.serializers import (
    DNS_LABEL_PATTERN,
    IssuedTokenOutput,
    RevokedCountOutput,
    ServiceAccountCreateInput,
    ServiceAccountDeleteOutput,
    ServiceAccountOutput,
    TokenCreateInput,
    TokenOutput,
)
from apps.accounts.models import AccessToken, ServiceAccount
from apps.accounts.services import IssuedToken
from apps.api.pagination import ByName, NewestFirst
from apps.api.params import DoorChecks
from apps.core import access

NAMESPACE = OpenApiParameter(
    "namespace",
    {"type": "string", "pattern": DNS_LABEL_PATTERN},
    description="the service account's namespace (default: default)",
)
TOKEN_ID = OpenApiParameter("token_id", OpenApiTypes.UUID, OpenApiParameter.PATH)


def _namespace(request: Request) -> str:
    raw = request.query_params.get("namespace")
    return services.DEFAULT_NAMESPACE if raw is None else services.namespace_validate(raw)


def _expires_in(data: dict[str, Any]) -> timedelta | None:
    seconds = data.get("expires_in_seconds")
    return timedelta(seconds=seconds) if seconds is not None else None


def _issued(issued: IssuedToken) -> Response:
    body = IssuedTokenOutput(issued.token, context={"key": issued.key}).data
    return Response(body, status=status.HTTP_201_CREATED, headers={"Cache-Control": "no-store"})


class ServiceAccountViewSet(DoorChecks, viewsets.GenericViewSet[Any]):  # lists accounts and tokens
    """Service accounts: identities for programs, each with its own expiring tokens. Deleting
    one disables it and revokes its tokens at once."""

    serializer_class = ServiceAccountOutput
    pagination_class = ByName
    queryset = ServiceAccount.objects.none()
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    path_patterns = {"name": DNS_LABEL_PATTERN}
    path_ids = {"token_id": "token"}

    # The access module's rules (apps/api/permissions.py); each action also asks
    # ``selectors.account_authorize`` in the namespace it acts in.
    access_resource = "accounts"
    access_verbs = {
        "list": "list",
        "retrieve": "get",
        "create": "create",
        "destroy": "delete",
        "tokens": "get",
        "tokens_create": "update",
        "tokens_revoke_all": "update",
        "revoke_token": "update",
    }

    @extend_schema(parameters=[NAMESPACE], responses=ServiceAccountOutput(many=True))
    def list(self, request: Request) -> Response:
        """The namespace's service accounts, deleted ones too (``disabled_at`` set)."""
        accounts = selectors.service_account_list(user=request.user, namespace=_namespace(request))
        page = self.paginate_queryset(accounts)
        return self.get_paginated_response(ServiceAccountOutput(page, many=True).data)

    @extend_schema(parameters=[NAMESPACE], request=ServiceAccountCreateInput, responses={201: ServiceAccountOutput})
    def create(self, request: Request) -> Response:
        """A new service account (409 if the name is taken, by a live or a deleted account)."""
        namespace = _namespace(request)
        selectors.account_authorize(user=request.user, verb="create", namespace=namespace)
        access.namespace_check(namespace)
        data = ServiceAccountCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        account = services.service_account_create(
            name=data.validated_data["name"],
            namespace=namespace,
            description=data.validated_data["description"],
            actor=request.user,
        )
        shown = selectors.service_account_get(user=request.user, name=account.name, namespace=namespace)
        return Response(ServiceAccountOutput(shown).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[NAMESPACE], responses=ServiceAccountOutput)
    def retrieve(self, request: Request, name: str) -> Response:
        account = selectors.service_account_get(user=request.user, name=name, namespace=_namespace(request))
        return Response(ServiceAccountOutput(account).data)

    @extend_schema(parameters=[NAMESPACE], request=None, responses={200: ServiceAccountDeleteOutput})
    def destroy(self, request: Request, name: str) -> Response:
        """Disable the account and revoke all its tokens (its websockets close); the name stays taken."""
        namespace = _namespace(request)
        account = selectors.service_account_get(user=request.user, name=name, namespace=namespace, verb="delete")
        _, revoked = services.service_account_delete(account=account, actor=request.user)
        shown = selectors.service_account_get(user=request.user, name=name, namespace=namespace)
        return Response(ServiceAccountDeleteOutput({"account": shown, "revoked_tokens": revoked}).data)

    @extend_schema(parameters=[NAMESPACE], responses=TokenOutput(many=True))
    @action(detail=True, methods=["get"], pagination_class=NewestFirst)
    def tokens(self, request: Request, name: str) -> Response:
        """The account's tokens, newest first (first characters, status, expiry; never a key)."""
        account = selectors.service_account_get(user=request.user, name=name, namespace=_namespace(request))
        page = self.paginate_queryset(selectors.service_account_token_list(user=request.user, account=account))
        return self.get_paginated_response(TokenOutput(page, many=True).data)

    @extend_schema(parameters=[NAMESPACE], request=TokenCreateInput, responses={201: IssuedTokenOutput})
    @tokens.mapping.post
    def tokens_create(self, request: Request, name: str) -> Response:
        """A new token of the account: its key is in this answer only."""
        namespace = _namespace(request)
        account = selectors.service_account_get(user=request.user, name=name, namespace=namespace, verb="token.create")
        data = TokenCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        issued = services.service_account_token_issue(
            account=account,
            expires_in=_expires_in(data.validated_data),
            comment=data.validated_data["comment"],
            actor=request.user,
        )
        return _issued(issued)

    @extend_schema(
        parameters=[NAMESPACE],
        request=None,
        responses={200: RevokedCountOutput},
        operation_id="v1_accounts_tokens_revoke_all",
    )
    @tokens.mapping.delete
    def tokens_revoke_all(self, request: Request, name: str) -> Response:
        """Revoke every token of the account at once (their websockets close)."""
        namespace = _namespace(request)
        account = selectors.service_account_get(user=request.user, name=name, namespace=namespace, verb="token.revoke")
        revoked = services.access_tokens_revoke_all(user=account.user, actor=request.user, reason="revoked")
        return Response(RevokedCountOutput({"revoked_tokens": revoked}).data)

    @extend_schema(
        parameters=[NAMESPACE, TOKEN_ID],
        request=None,
        responses={200: TokenOutput},
        operation_id="v1_accounts_tokens_revoke",
    )
    @action(detail=True, methods=["delete"], url_path=r"tokens/(?P<token_id>[^/.]+)")
    def revoke_token(self, request: Request, name: str, token_id: str) -> Response:
        """Revoke one of the account's tokens (revoking a revoked one changes nothing)."""
        namespace = _namespace(request)
        account = selectors.service_account_get(user=request.user, name=name, namespace=namespace, verb="token.revoke")
        token = selectors.service_account_token_get(user=request.user, account=account, token_id=token_id)
        selectors.account_authorize(user=request.user, verb="token.revoke", namespace=namespace)
        return Response(TokenOutput(services.access_token_revoke(token=token, actor=request.user)).data)


class OwnTokenViewSet(DoorChecks, viewsets.GenericViewSet[AccessToken]):
    """The caller's own API tokens: list them, create one, revoke one (the one in use too)."""

    serializer_class = TokenOutput
    pagination_class = NewestFirst
    queryset = AccessToken.objects.none()
    path_ids = {"pk": "token"}

    # A caller's own tokens belong to no namespace: every signed-in caller, and the selectors
    # narrow to its own tokens (``selectors.account_authorize``, the ``own.*`` verbs).
    access_narrowed = ("list", "retrieve", "create", "destroy")

    @extend_schema(responses=TokenOutput(many=True))
    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(selectors.own_token_list(user=request.user))
        return self.get_paginated_response(TokenOutput(page, many=True).data)

    @extend_schema(request=TokenCreateInput, responses={201: IssuedTokenOutput})
    def create(self, request: Request) -> Response:
        """A new token of the caller's (not for a service account: an administrator issues those)."""
        selectors.account_authorize(user=request.user, verb="own.create", namespace=None)
        data = TokenCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        issued = services.access_token_issue(
            user=request.user,
            expires_in=_expires_in(data.validated_data),
            comment=data.validated_data["comment"],
            actor=request.user,
        )
        return _issued(issued)

    @extend_schema(responses=TokenOutput)
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(TokenOutput(selectors.own_token_get(user=request.user, token_id=pk)).data)

    @extend_schema(request=None, responses={200: TokenOutput})
    def destroy(self, request: Request, pk: str) -> Response:
        """Revoke one of the caller's tokens, at once (revoking a revoked one changes nothing)."""
        token = selectors.own_token_get(user=request.user, token_id=pk)
        selectors.account_authorize(user=request.user, verb="own.revoke", namespace=None)
        return Response(TokenOutput(services.access_token_revoke(token=token, actor=request.user)).data)
