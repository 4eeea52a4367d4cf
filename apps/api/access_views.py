"""Namespaces, roles and role bindings over REST: who may do what, readable and changeable
through the access module's own rules (``apps/core/rbac.py`` writes, ``apps/core/selectors.py``
reads)."""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api.pagination import ByName, Paged
from apps.api.params import DoorChecks
from apps.api.permissions import request_namespace
from apps.api.strict import StrictInput
from apps.core import access, rbac, selectors
from apps.core.errors import ValidationFailed
from apps.core.models import Namespace, Role, RoleBinding


class NamespaceOutput(serializers.ModelSerializer[Namespace]):
    created_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = Namespace
        fields = ["name", "description", "created_at", "created_by"]
        read_only_fields = fields


class NamespaceInput(StrictInput):
    name = serializers.CharField(max_length=63)
    description = serializers.CharField(max_length=400, required=False, default="", allow_blank=True)


class RuleSerializer(serializers.Serializer[Any]):
    verbs = serializers.ListField(child=serializers.CharField(max_length=40), min_length=1)
    resources = serializers.ListField(child=serializers.CharField(max_length=40), min_length=1)


class RoleOutput(serializers.ModelSerializer[Role]):
    rules = RuleSerializer(many=True)

    class Meta:
        model = Role
        fields = ["name", "description", "rules", "is_builtin"]
        read_only_fields = fields


class RoleInput(StrictInput):
    name = serializers.CharField(max_length=63)
    description = serializers.CharField(max_length=400, required=False, default="", allow_blank=True)
    rules = serializers.JSONField(help_text="a list of {verbs: [...], resources: [...]}; * matches any")


class BindingOutput(serializers.ModelSerializer[RoleBinding]):
    role: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="name", read_only=True)
    user: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    group: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )
    created_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = RoleBinding
        fields = ["id", "role", "namespace", "user", "group", "created_at", "created_by"]
        read_only_fields = fields


class BindingInput(StrictInput):
    role = serializers.CharField(max_length=63)
    namespace = serializers.CharField(max_length=63, help_text="a namespace, or * for every namespace")
    user = serializers.CharField(max_length=150, required=False, allow_null=True, default=None)
    group = serializers.CharField(max_length=150, required=False, allow_null=True, default=None)


class NamespaceViewSet(DoorChecks, viewsets.GenericViewSet[Namespace]):
    """Namespaces: the boundaries everything a user names lives in. Everyone sees the
    namespaces they are bound in; making and deleting one needs a binding in ``*``."""

    serializer_class = NamespaceOutput
    pagination_class = ByName
    queryset = Namespace.objects.none()
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9-]+"
    access_resource = "namespaces"
    access_verbs = {"list": "list", "retrieve": "get", "create": "create", "destroy": "delete"}

    @extend_schema(responses=NamespaceOutput(many=True))
    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(selectors.namespace_list(user=request.user))
        return self.get_paginated_response(NamespaceOutput(page, many=True).data)

    @extend_schema(responses=NamespaceOutput)
    def retrieve(self, request: Request, name: str) -> Response:
        return Response(NamespaceOutput(selectors.namespace_get(user=request.user, name=name)).data)

    @extend_schema(request=NamespaceInput, responses={201: NamespaceOutput})
    def create(self, request: Request) -> Response:
        data = NamespaceInput(data=request.data)
        data.is_valid(raise_exception=True)
        namespace = rbac.namespace_create(**data.validated_data, actor=request.user)
        return Response(NamespaceOutput(namespace).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request: Request, name: str) -> Response:
        """Delete an empty namespace (one holding records, runs, pipelines or secrets is a 409
        counting what is left; records' tombstones do not count)."""
        rbac.namespace_delete(name=name, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class RoleViewSet(DoorChecks, viewsets.GenericViewSet[Role]):
    """Roles: additive rules of verbs by resources. Built-in: admin, developer, viewer,
    agent-installer. Readable by every signed-in caller (a role says nothing about data)."""

    serializer_class = RoleOutput
    pagination_class = ByName
    queryset = Role.objects.none()
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9-]+"
    access_resource = "roles"
    access_verbs = {"list": "list", "retrieve": "get", "create": "create", "destroy": "delete"}

    @extend_schema(responses=RoleOutput(many=True))
    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(selectors.role_list())
        return self.get_paginated_response(RoleOutput(page, many=True).data)

    @extend_schema(responses=RoleOutput)
    def retrieve(self, request: Request, name: str) -> Response:
        return Response(RoleOutput(selectors.role_get(name=name)).data)

    @extend_schema(request=RoleInput, responses={201: RoleOutput})
    def create(self, request: Request) -> Response:
        data = RoleInput(data=request.data)
        data.is_valid(raise_exception=True)
        role = rbac.role_create(**data.validated_data, actor=request.user)
        return Response(RoleOutput(role).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request: Request, name: str) -> Response:
        rbac.role_delete(name=name, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class BindingViewSet(DoorChecks, viewsets.GenericViewSet[RoleBinding]):
    """Role bindings: a role granted to a user (service accounts are users) or a group in a
    namespace, or in every namespace (``*``)."""

    serializer_class = BindingOutput
    pagination_class = Paged
    queryset = RoleBinding.objects.none()
    access_resource = "rolebindings"
    access_verbs = {"create": "create", "destroy": "delete"}
    # Everyone may list bindings: their own, and those of the namespaces where they may list them.
    access_narrowed = ("list",)

    def paginate_queryset(self, queryset: Any) -> Any:
        self.paginator.ordering = ("id",)  # type: ignore[union-attr]
        return super().paginate_queryset(queryset)

    @extend_schema(
        parameters=[
            OpenApiParameter("namespace", str, description="bindings in this namespace (or *)"),
            OpenApiParameter("user", str, description="bindings of this user"),
        ],
        responses=BindingOutput(many=True),
    )
    def list(self, request: Request) -> Response:
        qs = selectors.binding_list(
            user=request.user, namespace=request_namespace(request), subject=request.query_params.get("user")
        )
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(BindingOutput(page, many=True).data)

    @extend_schema(request=BindingInput, responses={201: BindingOutput, 200: BindingOutput})
    def create(self, request: Request) -> Response:
        """Bind (200 with the existing binding when it was there already)."""
        data = BindingInput(data=request.data)
        data.is_valid(raise_exception=True)
        binding, created = rbac.role_bind(**data.validated_data, actor=request.user)
        access.grants_forget(request.user)
        return Response(BindingOutput(binding).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request: Request, pk: str) -> Response:
        if not re.fullmatch(r"-?[0-9]{1,18}", pk):
            raise ValidationFailed(f"binding ids are numbers, not {pk!r}", fields={"id": ["a number"]})
        rbac.role_unbind(binding_id=int(pk), actor=request.user)  # no such binding (a negative id too): 404
        return Response(status=status.HTTP_204_NO_CONTENT)
