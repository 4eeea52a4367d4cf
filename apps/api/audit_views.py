"""The audit trail over REST: ``GET /api/v1/audit/``, newest first, narrowed to the namespaces
where the caller may list the audit trail (``apps.core.selectors.audit_list``). Read-only: the
trail is written by the services, in the transactions of the changes it records."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from apps.api import schema as api_schema
from apps.api.pagination import NewestFirst
from apps.api.params import DoorChecks, datetime_param
from apps.api.permissions import request_namespace
from apps.core import selectors
from apps.core.errors import ValidationFailed
from apps.core.models import AuditActorKind, AuditEntry


class AuditEntryOutput(serializers.ModelSerializer[AuditEntry]):
    class Meta:
        model = AuditEntry
        fields = [
            "id",
            "created_at",
            "actor_kind",
            "actor_id",
            "actor_name",
            "action",
            "resource",
            "object_id",
            "object_name",
            "namespace",
            "request_id",
            "before_digest",
            "after_digest",
            "detail",
        ]
        read_only_fields = fields


# Text filters longer than any stored value are refused (they could match nothing).
_TEXT_FILTERS = {"actor": 150, "action": 40, "object": 64, "request_id": 64}


def _text(name: str, description: str) -> OpenApiParameter:
    return OpenApiParameter(
        name, {"type": "string", "minLength": 1, "maxLength": _TEXT_FILTERS[name]}, description=description
    )


class AuditViewSet(DoorChecks, viewsets.GenericViewSet[AuditEntry]):
    """The audit trail: every write, who made it (a user, a run, an agent, the system), on which
    object, in which namespace, under which request, with digests before and after."""

    serializer_class = AuditEntryOutput
    pagination_class = NewestFirst
    queryset = AuditEntry.objects.none()
    access_resource = "audit"
    access_verbs = {"list": "list"}

    @extend_schema(
        parameters=[
            OpenApiParameter("namespace", str, description="rows of this namespace (* for installation-wide objects)"),
            _text("actor", "the actor's name or id: a username, pipeline#n, a run's or an agent's id"),
            OpenApiParameter(
                "actor_kind", str, enum=list(AuditActorKind.values), description="user, run, agent, system"
            ),
            _text("action", "an action (record.create) or, without a dot, its family (record)"),
            _text("object", "rows of this object (a record's, run's, secret's id ...)"),
            api_schema.datetime_param("since", "rows at or after this instant (ISO 8601; naive means UTC)"),
            api_schema.datetime_param("until", "rows before this instant (ISO 8601; naive means UTC)"),
            _text("request_id", "the rows one request wrote (its X-Request-Id)"),
        ],
        responses=AuditEntryOutput(many=True),
    )
    def list(self, request: Request) -> Response:
        params = request.query_params
        for name, longest in _TEXT_FILTERS.items():
            value = params.get(name)
            if value is not None and (not value or len(value) > longest):
                raise ValidationFailed(
                    f"{name}: 1 to {longest} characters", fields={name: [f"1 to {longest} characters"]}
                )
        for name in ("since", "until"):
            if params.get(name) == "":  # given, and no instant: not "any time"
                raise ValidationFailed(f"{name}: an ISO 8601 date-time", fields={name: ["not a date-time"]})
        actor_kind = params.get("actor_kind")
        if actor_kind is not None and actor_kind not in AuditActorKind.values:
            raise ValidationFailed(
                f"actor_kind={actor_kind!r}: one of {', '.join(AuditActorKind.values)}",
                fields={"actor_kind": [f"one of {', '.join(AuditActorKind.values)}"]},
            )
        qs = selectors.audit_list(
            user=request.user,
            namespace=request_namespace(request),
            actor=params.get("actor"),
            actor_kind=actor_kind,
            action=params.get("action"),
            object_id=params.get("object"),
            since=datetime_param(params, "since"),
            until=datetime_param(params, "until"),
            request_id=params.get("request_id"),
        )
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(AuditEntryOutput(page, many=True).data)
