"""Views that belong to no single app."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

import graphene_project


class WhoAmI(APIView):
    """Who the token belongs to, and which server answered."""

    access_public = True  # every signed-in caller may ask who they are

    @extend_schema(
        responses=inline_serializer(
            "WhoAmI",
            fields={
                "username": serializers.CharField(),
                "is_staff": serializers.BooleanField(),
                "server_version": serializers.CharField(),
                "token_expires_at": serializers.DateTimeField(
                    allow_null=True, help_text="when the token in use expires (null for a Studio session)"
                ),
            },
        )
    )
    def get(self, request: Request) -> Response:
        expires_at = getattr(request.auth, "expires_at", None)  # an AccessToken (apps/accounts), or a session
        return Response(
            {
                "username": request.user.get_username(),
                "is_staff": bool(getattr(request.user, "is_staff", False)),
                "server_version": graphene_project.__version__,
                "token_expires_at": serializers.DateTimeField().to_representation(expires_at) if expires_at else None,
            }
        )
