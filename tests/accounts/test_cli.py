"""graphenectl account and token, end to end against the shared web server: what an operator
setting up CI relies on, from the console script's stdout, stderr and exit code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.accounts.models import AccessToken, ServiceAccount
from apps.core.models import AuditEntry
from tests import factories
from tests.factories import api_token
from tests.harness.embedded import Ctl
from tests.harness.net import http
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def admin_token(django_user_model: Any) -> str:
    user = django_user_model.objects.create_superuser(username="root", password="pw")
    return api_token(user, comment="admin's")


@pytest.fixture
def ctl(web: WebServer, admin_token: str, tmp_path: Path) -> Ctl:
    return Ctl(tmp_path / "config", **web.client_env(), GRAPHENE_TOKEN=admin_token)


def whoami(web: WebServer, key: str) -> tuple[int, Any]:
    return http("GET", f"{web.url}/api/v1/whoami/", token=key)


def test_a_service_account_for_ci_from_creation_to_deletion(ctl: Ctl, web: WebServer) -> None:
    factories.bind_namespace("team-a")
    created = ctl.ok("account", "create", "ci", "--description", "github actions", "-o", "json").json()
    assert created["username"] == "system:serviceaccount:default:ci"
    assert "service account team-a/deploy created" in ctl.ok("account", "create", "deploy", "-n", "team-a").err

    listed = ctl.ok("account", "list")
    header, row = listed.out.splitlines()
    assert header.split() == ["NAME", "NAMESPACE", "STATUS", "TOKENS", "AGE", "DESCRIPTION"]
    assert row.split()[:4] == ["ci", "default", "active", "0"]
    assert [a["name"] for a in ctl.ok("account", "list", "-n", "team-a", "-o", "json").json()] == ["deploy"]
    assert ctl.ok("account", "list", "-o", "yaml").out.startswith("- name: ci\n")

    # The key alone on stdout, once, with a warning on stderr.
    issued = ctl.ok("account", "token", "ci", "--expires-in", "30d", "--comment", "actions")
    key = issued.out.strip()
    assert issued.out == f"{key}\n"
    assert key.startswith("grt_")
    assert "the only time the token is shown" in issued.err
    status, who = whoami(web, key)
    assert (status, who["username"]) == (200, "system:serviceaccount:default:ci")
    as_json = ctl.ok("account", "token", "ci", "-o", "json").json()
    assert set(as_json) == {"key", "id", "expires_at"}
    assert not any(key in str(value) for value in AccessToken.objects.values_list())

    described = ctl.ok("account", "describe", "ci").out
    assert "system:serviceaccount:default:ci" in described
    assert f"{key[:12]}…" in described
    assert key not in described
    assert "actions" in described
    tokens = ctl.ok("account", "describe", "ci", "-o", "json").json()["tokens"]
    assert len(tokens) == 2
    assert {t["status"] for t in tokens} == {"active"}

    # Revoke one by the characters the list shows (refused at once), the other by its id.
    ctl.ok("account", "revoke", "ci", f"{key[:12]}…")
    status, refused = whoami(web, key)
    assert (status, refused["error"]) == (401, "token_revoked")
    assert whoami(web, as_json["key"])[0] == 200
    ctl.ok("account", "revoke", "ci", as_json["id"])
    assert whoami(web, as_json["key"])[0] == 401

    # --all, then delete: refused, listed as deleted, the name kept.
    third = ctl.ok("account", "token", "ci").out.strip()
    assert "revoked 1 token(s)" in ctl.ok("account", "revoke", "ci", "--all").err
    assert whoami(web, third)[0] == 401
    fourth = ctl.ok("account", "token", "ci").out.strip()
    deleted = ctl.ok("account", "delete", "ci")
    assert "1 token(s) revoked" in deleted.err
    assert whoami(web, fourth)[0] == 401
    assert ctl.ok("account", "list", "-o", "json").json()[0]["disabled_at"]
    again = ctl("account", "create", "ci")
    assert again.code == 1
    assert "names are not reused" in again.err
    assert ServiceAccount.objects.count() == 2

    # Each write left its row, as the admin's (the refused creation none); never a key.
    ci = ServiceAccount.objects.get(namespace="default", name="ci")
    rows = list(AuditEntry.objects.filter(resource="accounts", namespace="default").order_by("id"))
    tokens = dict(AccessToken.objects.filter(user=ci.user).values_list("prefix", "pk"))
    assert [(r.action, r.object_id) for r in rows] == [
        ("account.create", str(ci.pk)),
        ("token.create", str(tokens[key[:12]])),
        ("token.create", as_json["id"]),
        ("token.revoke", str(tokens[key[:12]])),
        ("token.revoke", as_json["id"]),
        ("token.create", str(tokens[third[:12]])),
        ("token.revoke", str(tokens[third[:12]])),
        ("token.create", str(tokens[fourth[:12]])),
        ("token.revoke", str(tokens[fourth[:12]])),
        ("account.delete", str(ci.pk)),
    ]
    assert {(r.actor_kind, r.actor_name) for r in rows} == {("user", "root")}
    assert AuditEntry.objects.filter(action="account.create", namespace="team-a", object_name="deploy").exists()
    trail = str(list(AuditEntry.objects.values_list()))
    assert not any(k[12:] in trail for k in (key, as_json["key"], third, fourth))


def test_refusals_exit_with_their_codes_and_change_nothing(ctl: Ctl, django_user_model: Any) -> None:
    bad = ctl("account", "create", "CI")
    assert bad.code == 2
    assert "1-63 lowercase letters" in bad.err
    assert ctl("account", "list", "-n", "Team").code == 2
    assert ctl("account", "token", "nobody").code == 3
    assert ctl("account", "token", "x", "--expires-in", "soon").code == 2
    ctl.ok("account", "create", "ci")
    too_long = ctl("account", "token", "ci", "--expires-in", "400d")
    assert too_long.code == 2
    assert "GRAPHENE_TOKEN_MAX_TTL_DAYS" in too_long.err
    assert ctl("account", "revoke", "ci").code == 2  # neither a token nor --all
    assert ctl("account", "revoke", "ci", "grt_nothing1", "--all").code == 2
    assert ctl("account", "revoke", "ci", "grt_nothing1").code == 3
    plain = django_user_model.objects.create_user(username="plain", password="pw")
    forbidden = ctl("account", "list", env={"GRAPHENE_TOKEN": api_token(plain)})
    assert forbidden.code == 1
    assert "plain may not list accounts in namespace 'default'" in forbidden.err
    assert not AccessToken.objects.filter(user__service_account__isnull=False).exists()


def test_ones_own_tokens(ctl: Ctl, web: WebServer, admin_token: str) -> None:
    listed = ctl.ok("token", "list").out.splitlines()
    assert listed[0].split()[:3] == ["ID", "TOKEN", "STATUS"]
    assert listed[1].startswith("*")  # the token in use
    assert "admin's" in listed[1]

    created = ctl.ok("token", "create", "--expires-in", "1h", "--comment", "second machine")
    key = created.out.strip()
    assert whoami(web, key)[1]["username"] == "root"
    assert "the only time the token is shown" in created.err
    rows = ctl.ok("token", "list", "-o", "json").json()
    assert [t["comment"] for t in rows] == ["second machine", "admin's"]
    assert all("key" not in t for t in rows)

    # The new one revokes the one in use, by its id: told so, and refused from then on.
    as_new = Ctl(ctl.config_home, **web.client_env(), GRAPHENE_TOKEN=key)
    in_use = next(t for t in rows if t["comment"] == "admin's")
    revoked = ctl.ok("token", "revoke", in_use["id"])
    assert "that was the token this command used" in revoked.err
    refused = ctl("token", "list")
    assert refused.code == 1
    assert "was revoked at" in refused.err
    assert [t["status"] for t in as_new.ok("token", "list", "-o", "json").json()] == ["active", "revoked"]
    assert whoami(web, admin_token)[0] == 401

    # A person's tokens are installation-wide: their rows are in *, as the user who acted.
    new = next(t for t in rows if t["comment"] == "second machine")
    trail = AuditEntry.objects.filter(action__startswith="token.", actor_kind="user").order_by("id")
    assert [(r.action, r.object_id, r.namespace, r.actor_name) for r in trail] == [
        ("token.create", new["id"], "*", "root"),
        ("token.revoke", in_use["id"], "*", "root"),
    ]
    assert key[12:] not in str(list(trail.values_list()))
