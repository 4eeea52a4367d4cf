"""The SDK's ``Client`` connects as graphenectl does: the contexts ``graphenectl login`` saves,
``GRAPHENE_CONTEXT`` to pick one, ``GRAPHENE_SERVER``/``GRAPHENE_TOKEN`` over it, one by one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from graphene_sdk import Client, ClientError, ConfigError
from graphene_sdk import config as graphene_config
from rest_framework.authtoken.models import Token

from tests import factories
from tests.harness.embedded import Ctl
from tests.harness.net import free_port
from tests.harness.web import WebServer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token(django_user_model: Any) -> str:
    user = django_user_model.objects.create_user(username="sdk", password="pw")
    factories.bind(user, "developer")
    return str(Token.objects.create(user=user).key)


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This process's XDG_CONFIG_HOME, with no GRAPHENE_* variable set."""
    for name in ("GRAPHENE_SERVER", "GRAPHENE_TOKEN", "GRAPHENE_CONTEXT", "GRAPHENE_CA_FILE", "GRAPHENE_INSECURE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config"


def test_the_client_uses_graphenectl_contexts_and_the_environment_over_them(
    web: WebServer, token: str, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctl = Ctl(home)
    ctl.ok(
        "login", "--server", web.url + "/api/v1/", "--ca-file", str(web.ca_file), "--token-stdin", "--name", "local",
        stdin=token,
    )  # fmt: skip
    # A second context, for a server that is not running (graphenectl's login would refuse it).
    dead = f"https://127.0.0.1:{free_port()}"
    saved = graphene_config.load()
    saved.contexts["dead"] = graphene_config.ContextEntry(name="dead", server=dead, token="stale")
    graphene_config.save(saved)
    assert [c["name"] for c in ctl.ok("ctx", "list", "-o", "json").json()] == ["local", "dead"]

    client = Client()  # the current context, as graphenectl's
    assert (client.server, client.target.context, client.target.server_from) == (web.url, "local", "context 'local'")
    assert client.whoami()["username"] == "sdk"

    other = Client(context="dead")
    assert other.server == dead
    with pytest.raises(ClientError) as unreachable:
        other.runs.list().first(1)
    assert (unreachable.value.status, unreachable.value.code) == (0, "unreachable")
    assert dead in str(unreachable.value)

    # GRAPHENE_CONTEXT picks a context, as for graphenectl; both say where each value came from.
    monkeypatch.setenv("GRAPHENE_CONTEXT", "dead")
    assert Client().target.context == "dead"
    shown = ctl.ok("ctx", "show", "-o", "json", env={"GRAPHENE_CONTEXT": "dead"}).json()
    target = Client().target
    assert (shown["name"], shown["server"], shown["server_from"], shown["token_from"]) == (
        target.context,
        target.server,
        target.server_from,
        target.token_from,
    )

    # A server passed as an argument takes the token of the context saved for it.
    by_server = Client(web.url)
    assert (by_server.target.context, by_server.target.token_from) == ("local", "context 'local'")
    assert by_server.whoami()["username"] == "sdk"

    # GRAPHENE_SERVER overrides the context's server only: its token is still the context's.
    monkeypatch.setenv("GRAPHENE_SERVER", web.url)
    mixed = Client()
    assert (mixed.server, mixed.target.server_from, mixed.target.token_from) == (
        web.url,
        "GRAPHENE_SERVER",
        "context 'dead'",
    )
    with pytest.raises(ClientError) as refused:
        mixed.whoami()
    assert refused.value.status == 401
    assert "graphenectl login" in str(refused.value)
    monkeypatch.setenv("GRAPHENE_TOKEN", token)
    assert Client().whoami()["username"] == "sdk"
    assert Client().target.token_from == "GRAPHENE_TOKEN"

    # Arguments win over both.
    assert Client(dead, token="x").target.server_from == "argument"
    with pytest.raises(ConfigError) as unknown:
        Client(context="nope")
    assert unknown.value.is_usage
    assert "no context 'nope'" in str(unknown.value)
    assert "contexts: dead, local" in str(unknown.value)


def test_without_contexts_or_environment_the_client_says_how_to_connect(
    web: WebServer, token: str, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError) as nothing:
        Client()
    assert "graphenectl login --server URL --token-stdin" in str(nothing.value)
    assert "GRAPHENE_SERVER" in str(nothing.value)
    with pytest.raises(ConfigError, match="no token for"):
        Client(web.url)
    monkeypatch.setenv("GRAPHENE_SERVER", web.url + "/api/v1")
    monkeypatch.setenv("GRAPHENE_TOKEN", token)
    monkeypatch.setenv("GRAPHENE_CA_FILE", str(web.ca_file))
    client = Client()  # CI: the environment alone
    assert client.server == web.url
    assert client.target.context is None
    assert client.whoami()["username"] == "sdk"
    monkeypatch.delenv("GRAPHENE_SERVER")
    assert Client(web.url).whoami()["username"] == "sdk", "a server passed here takes GRAPHENE_TOKEN"
    with pytest.raises(ConfigError, match="is not a URL") as bad:
        Client("127.0.0.1:8000")
    assert bad.value.is_usage
