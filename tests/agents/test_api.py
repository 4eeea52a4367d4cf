"""The agents REST API and the command services, in-process (no agent connected)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from apps.agents import services
from apps.agents.choices import CommandStatus
from apps.agents.models import AgentCommand
from apps.records.models import Record
from apps.records.services import record_create_root
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def stand() -> Record:
    return record_create_root(kind="graphene.stand", name="agents-api")


@pytest.fixture
def agent(stand: Record) -> Record:
    return services.agent_declare(owner=stand, name="box", labels={"role": "ci"}).record


@pytest.fixture
def operator(api: APIClient, user: Any) -> APIClient:
    """A developer (runs commands on agents)."""
    return api


def test_declare_returns_install_data_and_stores_only_digests(stand: Record) -> None:
    record, token, script = services.agent_declare(owner=stand, name="m1", server_url="https://graphene.example")
    assert record.kind == "agent"
    assert token.startswith("gab_")
    assert script.startswith("#!/bin/sh")
    assert "https://graphene.example" in script
    assert token in script
    assert f"GRAPHENE_AGENT_ID={record.pk}" in script
    assert not record.agent_tokens.filter(digest=token).exists()
    assert record.agent_tokens.count() == 1
    again = services.agent_declare(owner=stand, name="m1")
    assert again.record.pk == record.pk
    assert again.bootstrap_token != token


def test_list_shows_connection_state_and_facts_within_a_query_budget(operator: APIClient, stand: Record) -> None:
    for i in range(5):
        services.agent_declare(owner=stand, name=f"agent-{i}")
    with CaptureQueriesContext(connection) as queries:
        response = operator.get("/api/v1/agents/")
    assert response.status_code == 200
    assert len(response.data["results"]) == 5
    assert len(queries) <= 4
    first = response.data["results"][0]
    assert first["connected"] is False
    assert first["facts"] == {}
    assert first["phase"] == "pending"
    assert operator.get("/api/v1/agents/?connected=maybe").status_code == 400


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "argv"),
        ({"argv": []}, "argv"),
        ({"argv": "ls -l"}, "argv"),
        ({"argv": ["ls", 3]}, "argv.1"),
        ({"argv": ["ls"], "env": {"A=B": "x"}}, "env.A=B"),
        ({"argv": ["ls"], "env": {"A": 1}}, "env.A"),
        ({"argv": ["ls"], "cwd": "relative/dir"}, "cwd"),
        ({"argv": ["ls"], "timeout": 0}, "timeout"),
        ({"argv": ["ls"], "timeout": "soon"}, "timeout"),
        ({"argv": ["ls"], "guarantee": "exactly_once"}, "guarantee"),
        ({"argv": ["ls"], "shell": True}, "shell"),
    ],
)
def test_exec_input_errors_name_the_field(operator: APIClient, agent: Record, body: dict[str, Any], field: str) -> None:
    response = operator.post(f"/api/v1/agents/{agent.pk}/exec/", body, format="json")
    assert response.status_code == 400, response.data
    assert field in response.data["fields"], response.data
    assert not AgentCommand.objects.exists()


def test_exec_needs_the_permission_and_queues_a_command(api: APIClient, operator: APIClient, agent: Record) -> None:
    body = {"argv": ["echo", "hi"], "timeout": 5}
    forbidden = APIClient()
    forbidden.credentials(HTTP_AUTHORIZATION=api._credentials["HTTP_AUTHORIZATION"])  # type: ignore[attr-defined]
    response = operator.post(f"/api/v1/agents/{agent.pk}/exec/", body, format="json")
    assert response.status_code == 202
    assert response.data["status"] == "queued"
    command_id = response.data["id"]
    polled = operator.get(f"/api/v1/agents/{agent.pk}/commands/{command_id}/")
    assert polled.status_code == 200
    assert polled.data["payload"]["argv"] == ["echo", "hi"]
    listed = operator.get(f"/api/v1/agents/{agent.pk}/commands/")
    assert [c["id"] for c in listed.data["results"]] == [command_id]
    cancelled = operator.post(f"/api/v1/agents/{agent.pk}/commands/{command_id}/cancel/")
    assert cancelled.status_code == 202
    assert cancelled.data["status"] == "cancelled"
    malformed = operator.get(f"/api/v1/agents/{agent.pk}/commands/not-a-uuid/")
    assert malformed.status_code == 400
    assert list(malformed.json()["fields"]) == ["command_id"]


def test_exec_without_the_permission_is_forbidden(viewer_api: APIClient, agent: Record) -> None:
    response = viewer_api.post(f"/api/v1/agents/{agent.pk}/exec/", {"argv": ["id"]}, format="json")
    assert response.status_code == 403
    assert "may not exec agents in namespace 'default'" in response.data["detail"]
    assert not AgentCommand.objects.filter(agent=agent).exists()


def test_commands_of_a_deleted_agent_are_refused_and_open_ones_end(agent: Record) -> None:
    queued = services.command_submit(agent=agent, kind="exec", payload={"argv": ["true"]})
    services.agent_retire(record=agent)
    assert AgentCommand.objects.get(pk=queued.pk).status == CommandStatus.CANCELLED
    assert not agent.agent_tokens.filter(revoked_at__isnull=True).exists()


def test_payload_validation_of_file_commands(agent: Record) -> None:
    from apps.core.errors import ValidationFailed

    with pytest.raises(ValidationFailed) as bad_b64:
        services.command_submit(agent=agent, kind="put_file", payload={"path": "/x", "data": "***"})
    assert "data" in bad_b64.value.fields
    with pytest.raises(ValidationFailed) as relative:
        services.command_submit(agent=agent, kind="get_file", payload={"path": "etc/passwd"})
    assert "path" in relative.value.fields
    with pytest.raises(ValidationFailed) as kind:
        services.command_submit(agent=agent, kind="reboot", payload={})
    assert "kind" in kind.value.fields


@pytest.fixture
def enroller(api: APIClient, user: Any) -> APIClient:
    factories.bind(user, "agent-installer")
    return api


def test_create_declares_an_agent_and_answers_its_install_data(enroller: APIClient, stand: Record) -> None:
    response = enroller.post("/api/v1/agents/", {"name": "m1", "labels": {"pool": "ci"}}, format="json")
    assert response.status_code == 201, response.data
    assert response["Cache-Control"] == "no-store"
    body = response.json()
    assert body["created"] is True
    assert body["agent"]["name"] == "m1"
    assert body["agent"]["labels"] == {"pool": "ci"}
    assert body["install_script"].startswith("#!/bin/sh")
    assert body["cloud_config"].startswith("#cloud-config\n")
    assert body["bootstrap_expires_at"]
    record = Record.objects.get(pk=body["agent"]["id"])
    assert (record.parent.kind, record.parent.name) == ("graphene.stand", services.STANDALONE_OWNER)

    again = enroller.post("/api/v1/agents/", {"name": "m1"}, format="json")
    assert again.status_code == 200
    assert again.json()["agent"]["id"] == body["agent"]["id"]
    assert again.json()["install_script"] != body["install_script"], "a fresh single-use token"

    owned = enroller.post("/api/v1/agents/", {"name": "m2", "owner": str(stand.pk)}, format="json")
    assert owned.status_code == 201
    assert Record.objects.get(pk=owned.json()["agent"]["id"]).parent_id == stand.pk


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "name"),
        ({"name": "m", "labels": ["a"]}, "labels"),
        ({"name": "m", "owner": "nope"}, "owner"),
        ({"name": "m", "lables": {}}, "lables"),
    ],
)
def test_create_refuses_bad_input_and_changes_nothing(enroller: APIClient, body: dict[str, Any], field: str) -> None:
    response = enroller.post("/api/v1/agents/", body, format="json")
    assert response.status_code == 400, response.data
    assert field in response.json()["fields"]
    assert not Record.objects.filter(kind="agent").exists()


def test_create_needs_a_role_that_enrolls_agents(operator: APIClient) -> None:
    response = operator.post("/api/v1/agents/", {"name": "m1"}, format="json")
    assert response.status_code == 403
    assert "may not create agents" in response.json()["detail"]
    assert not Record.objects.filter(kind="agent").exists()
    missing = "00000000-0000-4000-8000-000000000000"
    refused = operator.post("/api/v1/agents/", {"name": "m1", "owner": missing}, format="json")
    assert refused.status_code == 403
