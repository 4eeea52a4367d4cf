"""The SDK's ``Client`` and namespaces: ``Client(namespace=)``, ``GRAPHENE_NAMESPACE`` and the
context's namespace narrow its listings (each call may say otherwise), as graphenectl's -n,
against the shared web server. Runs of ``sample.team-b`` (namespace ``team-b``) stay queued.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from graphene_sdk import Client, ConfigError
from graphene_sdk import config as graphene_config

from apps.core import access
from apps.pipelines import services
from apps.records.models import Record
from tests import factories
from tests.factories import api_token
from tests.harness.web import WebServer

pytestmark = pytest.mark.django_db(transaction=True)

TEAM = "team-b"  # the namespace of sample.team-b


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This process's XDG_CONFIG_HOME, with no GRAPHENE_* variable set."""
    for name in (
        "GRAPHENE_SERVER",
        "GRAPHENE_TOKEN",
        "GRAPHENE_CONTEXT",
        "GRAPHENE_NAMESPACE",
        "GRAPHENE_CA_FILE",
        "GRAPHENE_INSECURE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config"


@pytest.fixture
def world(django_user_model: Any) -> dict[str, Any]:
    """An admin of every namespace; two runs of sample.team-b (team-b), one of sample.cli (default)."""
    access.builtins_ensure()  # the flush after a transactional test took the migration's rows
    ops = django_user_model.objects.create_user(username="ops", password="pw")
    factories.bind(ops, "admin", "*")
    factories.bind(ops, "admin", TEAM)  # makes the namespace
    team = [services.run_start(pipeline_name="sample.team-b", inputs={}) for _ in range(2)]
    other = services.run_start(pipeline_name="sample.cli", inputs={})
    return {
        "token": api_token(ops),
        "team": sorted(str(r.pk) for r in team),
        "other": [str(other.pk)],
    }


def run_ids(runs: Any) -> list[str]:
    return sorted(r.id for r in runs)


def test_a_client_in_a_namespace_lists_only_that_namespace(web: WebServer, home: Path, world: dict[str, Any]) -> None:
    client = Client(web.url, token=world["token"], namespace=TEAM, ca_file=web.ca_file)
    assert (client.namespace, client.target.namespace_from) == (TEAM, "argument")
    assert run_ids(client.runs.list()) == world["team"]
    assert {r.namespace for r in client.runs.list()} == {TEAM}
    assert {r.namespace for r in client.records.list()} == {TEAM}
    assert {r.id for r in client.records.list()} == {
        str(pk) for pk in Record.objects.filter(namespace=TEAM).values_list("pk", flat=True)
    }
    # Each call may say otherwise: another namespace, or "*" for every one.
    assert run_ids(client.runs.list(namespace="default")) == world["other"]
    assert run_ids(client.runs.list(namespace="*")) == sorted(world["team"] + world["other"])
    with pytest.raises(ValueError, match="'Team A' is not a namespace name"):
        client.runs.list(namespace="Team A")

    # No namespace: every one the caller may see.
    everywhere = Client(web.url, token=world["token"], ca_file=web.ca_file)
    assert everywhere.namespace is None
    assert run_ids(everywhere.runs.list()) == sorted(world["team"] + world["other"])
    assert run_ids(everywhere.runs.list(namespace=TEAM)) == world["team"]
    assert run_ids(Client(web.url, token=world["token"], namespace="*", ca_file=web.ca_file).runs.list()) == run_ids(
        everywhere.runs.list()
    )
    with pytest.raises(ConfigError) as bad:
        Client(web.url, token=world["token"], namespace="Team_A", ca_file=web.ca_file)
    assert bad.value.is_usage


def test_the_namespace_comes_from_the_environment_or_the_context(
    web: WebServer, home: Path, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = graphene_config.load()
    saved.contexts["ops"] = graphene_config.ContextEntry(
        name="ops", server=web.url, token=world["token"], user="ops", namespace=TEAM, ca=web.ca_file.read_text()
    )
    saved.current = "ops"
    graphene_config.save(saved)

    client = Client()
    assert (client.namespace, client.target.namespace_from) == (TEAM, "context 'ops'")
    assert run_ids(client.runs.list()) == world["team"]

    monkeypatch.setenv("GRAPHENE_NAMESPACE", "default")
    client = Client()
    assert (client.namespace, client.target.namespace_from) == ("default", "GRAPHENE_NAMESPACE")
    assert run_ids(client.runs.list()) == world["other"]
    assert Client(namespace=TEAM).namespace == TEAM, "an argument wins over the environment"
    monkeypatch.setenv("GRAPHENE_NAMESPACE", "*")
    assert run_ids(Client().runs.list()) == sorted(world["team"] + world["other"])


def test_a_pipelines_stand_is_made_in_the_pipelines_namespace(
    web: WebServer, home: Path, world: dict[str, Any]
) -> None:
    client = Client(web.url, token=world["token"], ca_file=web.ca_file)
    stand = client.stands.ensure("sample.team-b")
    assert Record.objects.get(pk=stand).namespace == TEAM
    assert client.stands.ensure("sample.team-b") == stand
    artifact = client.artifacts.put(b"team bytes", name="team.txt", owner=stand)
    assert artifact.namespace == TEAM
    assert [a.id for a in client.artifacts.list(namespace=TEAM)] == [artifact.id]
    assert list(client.artifacts.list(namespace="default")) == []
