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
            },
        )
    )
    def get(self, request: Request) -> Response:
        return Response(
            {
                "username": request.user.get_username(),
                "is_staff": bool(getattr(request.user, "is_staff", False)),
                "server_version": graphene_project.__version__,
            }
        )
