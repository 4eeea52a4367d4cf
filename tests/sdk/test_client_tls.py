"""The SDK's ``Client`` over TLS: it trusts the CA pinned for its server (``ca_file``,
``ca_fingerprint``, ``GRAPHENE_CA_FILE``, a context) and refuses, before sending anything, a
server that CA does not vouch for; plain HTTP only when asked for, and said."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from graphene_sdk import Client, ClientError, ConfigError
from rest_framework.authtoken.models import Token

from apps.core.tls import fingerprint, tls_local_ensure
from tests.harness.net import free_port
from tests.harness.web import WebServer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token(django_user_model: Any) -> str:
    user = django_user_model.objects.create_user(username="pinned", password="pw")
    return str(Token.objects.create(user=user).key)


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No contexts and no GRAPHENE_* variable: only what each test passes."""
    for name in ("GRAPHENE_SERVER", "GRAPHENE_TOKEN", "GRAPHENE_CONTEXT", "GRAPHENE_CA_FILE", "GRAPHENE_INSECURE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config"


def test_the_client_trusts_the_pinned_ca_and_refuses_a_server_it_does_not_vouch_for(
    web: WebServer, token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned = Client(web.url, token=token, ca_file=web.ca_file)
    assert pinned.whoami()["username"] == "pinned"
    assert pinned.target.trust.fingerprint == fingerprint(web.ca_file.read_text())

    # Nothing pinned: the system's trust store, which does not know the server's CA.
    with pytest.raises(ClientError) as untrusted:
        Client(web.url, token=token).whoami()
    assert (untrusted.value.status, untrusted.value.code) == (0, "untrusted_certificate")
    assert "not trusted by this system" in str(untrusted.value)
    assert "ca_file" in str(untrusted.value)  # how to pin it

    # Another installation's CA pinned: refused, naming the pin.
    other = tls_local_ensure(directory=tmp_path / "other-ca", hostnames=["127.0.0.1"])
    with pytest.raises(ClientError) as mismatched:
        Client(web.url, token=token, ca_file=other.ca_path).runs.list().first(1)
    assert mismatched.value.code == "untrusted_certificate"
    assert other.ca_fingerprint in str(mismatched.value)

    # By fingerprint: the server's CA is fetched and kept only if it has that fingerprint.
    by_fingerprint = Client(web.url, token=token, ca_fingerprint=fingerprint(web.ca_file.read_text()).lower())
    assert by_fingerprint.whoami()["username"] == "pinned"
    with pytest.raises(ConfigError, match="the CA it offers has the fingerprint"):
        Client(web.url, token=token, ca_fingerprint=other.ca_fingerprint)

    # From the environment, as CI jobs connect.
    monkeypatch.setenv("GRAPHENE_CA_FILE", str(web.ca_file))
    assert Client(web.url, token=token).whoami()["username"] == "pinned"
    assert Client(web.url, token=token).target.trust.source == "GRAPHENE_CA_FILE"


def test_plain_http_needs_insecure_and_says_so(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    plain = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError, match="plain HTTP") as refused:
        Client(plain, token="t")
    assert refused.value.is_usage
    assert "insecure=True" in str(refused.value)

    with caplog.at_level(logging.WARNING, logger="graphene_sdk"):
        client = Client(plain, token="t", insecure=True)
    assert client.target.trust.insecure
    assert any("plain HTTP" in r.message and "unencrypted" in r.message for r in caplog.records)
    with pytest.raises(ClientError) as unreachable:  # accepted: it tries (nothing listens there)
        client.whoami()
    assert unreachable.value.code == "unreachable"

    monkeypatch.setenv("GRAPHENE_INSECURE", "1")
    assert Client(plain, token="t").target.trust.source == "GRAPHENE_INSECURE"
