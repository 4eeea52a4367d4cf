"""Secrets over REST: thin views — input serializer, selector, one service call, output (names only)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from graphene_sdk._secrets import SECRET_NAME
from rest_framework import status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.pagination import ByName
from apps.api.params import DoorChecks
from apps.api.permissions import request_namespace, target_namespace
from apps.core import access
from apps.secrets import selectors, services
from apps.secrets.api.serializers import SecretCreateInput, SecretOutput, SecretReplaceInput
from apps.secrets.models import Secret


class SecretViewSet(DoorChecks, viewsets.GenericViewSet[Secret]):
    """Named secrets, encrypted at rest. Values go in (POST, PUT) and never come out."""

    serializer_class = SecretOutput
    pagination_class = ByName
    queryset = Secret.objects.none()
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    path_patterns = {"name": f"^{SECRET_NAME.pattern}$"}

    access_resource = "secrets"
    access_verbs = {
        "list": "read_secret_names",
        "retrieve": "read_secret_names",
        "create": "create",
        "update": "update",
        "destroy": "delete",
    }

    @extend_schema(responses=SecretOutput(many=True))
    def list(self, request: Request) -> Response:
        """Names and timestamps, in every namespace the caller may read (``?namespace=``: one)."""
        qs = selectors.secret_list(user=request.user, namespace=request_namespace(request))
        page = self.paginate_queryset(qs.order_by("namespace", "name"))
        return self.get_paginated_response(SecretOutput(page, many=True).data)

    @extend_schema(responses=SecretOutput)
    def retrieve(self, request: Request, name: str) -> Response:
        return Response(
            SecretOutput(selectors.secret_get(user=request.user, name=name, namespace=target_namespace(request))).data
        )

    @extend_schema(request=SecretCreateInput, responses={201: SecretOutput})
    def create(self, request: Request) -> Response:
        """Store a new secret in ``?namespace=`` (default ``default``); 409 if the name is taken
        there (replace it with PUT)."""
        namespace = target_namespace(request)
        access.require(request.user, "create", "secrets", namespace)
        access.namespace_check(namespace)
        data = SecretCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        secret = services.secret_create(
            name=data.validated_data["name"],
            value=data.validated_data["value"],
            namespace=namespace,
            actor=request.user,
        )
        return Response(SecretOutput(secret).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=SecretReplaceInput, responses={200: SecretOutput, 201: SecretOutput})
    def update(self, request: Request, name: str) -> Response:
        """Store or replace the value of ``name`` (201 when it was created)."""
        namespace = target_namespace(request)
        access.require(request.user, "update", "secrets", namespace)
        access.require(request.user, "create", "secrets", namespace)
        access.namespace_check(namespace)
        data = SecretReplaceInput(data=request.data)
        data.is_valid(raise_exception=True)
        secret, created = services.secret_set(
            name=name, value=data.validated_data["value"], namespace=namespace, actor=request.user
        )
        return Response(SecretOutput(secret).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request: Request, name: str) -> Response:
        namespace = target_namespace(request)
        access.require(request.user, "delete", "secrets", namespace)
        services.secret_delete(name=name, namespace=namespace, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
