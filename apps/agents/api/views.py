"""Agents over REST: thin views — input serializer, selector, one service call, output."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors, services
from apps.agents.api.serializers import (
    AgentCreateInput,
    AgentEnrollmentOutput,
    AgentOutput,
    CommandOutput,
    ExecInput,
)
from apps.agents.choices import CommandKind, CommandStatus
from apps.api import schema as api_schema
from apps.api.pagination import NewestFirst
from apps.api.params import DoorChecks
from apps.api.permissions import request_namespace
from apps.core import access
from apps.core.errors import ValidationFailed
from apps.records.models import Record
from apps.records.selectors import parse_label_selector, record_get

COMMAND_ID = OpenApiParameter("command_id", OpenApiTypes.UUID, OpenApiParameter.PATH)


def _bool_param(request: Request, name: str) -> bool | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise ValidationFailed(f"{name}={raw!r} must be true or false", fields={name: ["must be true or false"]})


class AgentViewSet(DoorChecks, viewsets.GenericViewSet[Any]):
    """Agents (records of kind ``agent``) with their connection state, facts and commands."""

    path_ids = {"pk": "agent", "command_id": "command"}
    serializer_class = AgentOutput
    pagination_class = NewestFirst
    queryset = Record.objects.none()
    lookup_value_regex = "[^/]+"
    access_resource = "agents"
    access_verbs = {
        "list": "list",
        "create": "create",
        "retrieve": "get",
        "commands": "get",
        "command": "get",
        "cancel": "exec",
        "exec": "exec",
    }

    @extend_schema(
        parameters=[
            api_schema.bool_param("connected", "only connected (true) or disconnected (false) agents"),
            api_schema.label_param(),
        ],
        responses=AgentOutput(many=True),
    )
    def list(self, request: Request) -> Response:
        qs: QuerySet[Record] = selectors.agent_list(
            user=request.user,
            connected=_bool_param(request, "connected"),
            labels=parse_label_selector(request.query_params.getlist("label")),
        )
        if namespace := request_namespace(request):
            qs = qs.filter(namespace=namespace)
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(AgentOutput(page, many=True).data)

    @extend_schema(request=AgentCreateInput, responses={201: AgentEnrollmentOutput, 200: AgentEnrollmentOutput})
    def create(self, request: Request) -> Response:
        """Declare an agent for a machine installed by hand or by cloud-init, and get its install
        data (201; 200 with a fresh token if it existed). The answer holds a single-use
        bootstrap token: it is not stored, logged or cached anywhere."""
        data = AgentCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        owner = record_get(user=request.user, record_id=v["owner"]) if v.get("owner") else None
        namespace = owner.namespace if owner is not None else v["namespace"]
        access.require(request.user, "create", "agents", namespace)
        access.namespace_check(namespace)
        enrollment = services.agent_enroll(
            name=v["name"], labels=v["labels"], owner=owner, namespace=namespace, actor=request.user
        )
        body = AgentEnrollmentOutput(
            {
                "agent": selectors.agent_get(user=request.user, agent_id=enrollment.record.pk),
                "created": enrollment.created,
                "install_script": enrollment.install_script,
                "cloud_config": enrollment.cloud_config,
                "bootstrap_expires_at": enrollment.bootstrap_expires_at,
            }
        ).data
        return Response(
            body,
            status=status.HTTP_201_CREATED if enrollment.created else status.HTTP_200_OK,
            headers={"Cache-Control": "no-store"},
        )

    @extend_schema(responses=AgentOutput)
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(AgentOutput(selectors.agent_get(user=request.user, agent_id=pk)).data)

    @extend_schema(
        parameters=[api_schema.enum_list_param("status", [*CommandStatus.values], "comma-separated statuses")],
        responses=CommandOutput(many=True),
    )
    @action(detail=True, methods=["get"])
    def commands(self, request: Request, pk: str) -> Response:
        agent = selectors.agent_get(user=request.user, agent_id=pk)
        statuses = [s for s in request.query_params.get("status", "").split(",") if s]
        page = self.paginate_queryset(selectors.command_list(agent=agent, statuses=statuses))
        return self.get_paginated_response(CommandOutput(page, many=True).data)

    @extend_schema(parameters=[COMMAND_ID], responses=CommandOutput)
    @action(detail=True, methods=["get"], url_path=r"commands/(?P<command_id>[^/.]+)")
    def command(self, request: Request, pk: str, command_id: str) -> Response:
        agent = selectors.agent_get(user=request.user, agent_id=pk)
        return Response(CommandOutput(selectors.command_get(agent=agent, command_id=command_id)).data)

    @extend_schema(parameters=[COMMAND_ID], request=None, responses=CommandOutput)
    @action(detail=True, methods=["post"], url_path=r"commands/(?P<command_id>[^/.]+)/cancel")
    def cancel(self, request: Request, pk: str, command_id: str) -> Response:
        agent = selectors.agent_get(user=request.user, agent_id=pk)
        command = selectors.command_get(agent=agent, command_id=command_id)
        command = services.command_cancel(command=command, actor=request.user)
        return Response(CommandOutput(command).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=ExecInput, responses={202: CommandOutput})
    @action(detail=True, methods=["post"])
    def exec(self, request: Request, pk: str) -> Response:
        """Run a program on the machine. Answers at once with the command; poll it for the result."""
        agent = selectors.agent_get(user=request.user, agent_id=pk)
        data = ExecInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        payload = {key: v[key] for key in ("argv", "env", "cwd", "timeout") if key in v}
        command = services.command_submit(
            agent=agent, kind=CommandKind.EXEC, payload=payload, guarantee=v["guarantee"], actor=request.user
        )
        return Response(CommandOutput(command).data, status=status.HTTP_202_ACCEPTED)
