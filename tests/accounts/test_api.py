"""API tokens and service accounts over REST: keys are shown once and stored as digests; an
expired, revoked, deleted-account or inactive-user token is a 401 saying why and what to do,
from the very next request; who may do what is decided in one place."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts import services
from apps.accounts.models import AccessToken, ServiceAccount
from tests import factories
from tests.factories import api_token

pytestmark = pytest.mark.django_db


def client(key: str | None = None, scheme: str = "Token") -> APIClient:
    api = APIClient()
    if key is not None:
        api.credentials(HTTP_AUTHORIZATION=f"{scheme} {key}")
    return api


@pytest.fixture
def root(django_user_model: Any) -> Any:
    return django_user_model.objects.create_superuser(username="root", password="pw")


@pytest.fixture
def admin(root: Any) -> APIClient:
    return client(api_token(root))


def whoami(key: str, scheme: str = "Token") -> Any:
    return client(key, scheme).get("/api/v1/whoami/")


def stored_anywhere(text: str) -> list[str]:
    """Every table and column of the whole database that holds ``text``."""
    found = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f'SELECT * FROM "{table}"')  # noqa: S608 - the database's own table names
            names = [column.name for column in cursor.description]
            for row in cursor.fetchall():
                found += [f"{table}.{name}" for name, value in zip(names, row, strict=True) if text in str(value)]
    return found


def at(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


# --- one's own tokens ---------------------------------------------------------------------------------


def test_a_new_token_is_shown_once_and_stored_only_as_its_digest(user: Any) -> None:
    api = client(api_token(user))
    created = api.post("/api/v1/tokens/", {"comment": "laptop", "expires_in_seconds": 3600}, format="json")
    assert created.status_code == 201, created.content
    assert created["Cache-Control"] == "no-store"
    body = created.json()
    key = body["key"]
    assert key.startswith("grt_")
    assert len(key) == 47
    assert body["prefix"] == key[:12]
    assert body["status"] == "active"
    assert body["comment"] == "laptop"
    assert timedelta(minutes=59) < at(body["expires_at"]) - datetime.now(UTC) <= timedelta(hours=1)

    assert stored_anywhere(key) == []  # hashed at rest: no column of any table holds the key
    assert stored_anywhere(key[12:30]) == []
    assert AccessToken.objects.get(pk=body["id"]).prefix == key[:12]

    # Never again: not in the list, not in the token's own answer.
    listed = api.get("/api/v1/tokens/")
    one = api.get(f"/api/v1/tokens/{body['id']}/")
    for answer in (listed, one):
        assert answer.status_code == 200
        assert key not in answer.content.decode()
        assert "key" not in (answer.json()["results"][0] if "results" in answer.json() else answer.json())
    assert {t["comment"] for t in listed.json()["results"]} == {"laptop", "test"}

    # The new key works, as Token and as Bearer.
    assert whoami(key).json()["username"] == "alice"
    assert whoami(key, "Bearer").status_code == 200
    assert whoami(key, "bearer").status_code == 200


def test_a_users_token_expires_after_the_configured_days_and_is_refused_then(user: Any, settings: Any) -> None:
    settings.GRAPHENE_USER_TOKEN_TTL_DAYS = 7
    key = api_token(user)
    row = AccessToken.objects.get(user=user)
    assert timedelta(days=6, hours=23) < row.expires_at - timezone.now() <= timedelta(days=7)
    assert whoami(key).status_code == 200

    AccessToken.objects.filter(pk=row.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    refused = whoami(key)
    assert refused.status_code == 401
    body = refused.json()
    assert body["error"] == "token_expired"
    expired_at = AccessToken.objects.get(pk=row.pk).expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"this token ({key[:12]}…) expired at {expired_at}" in body["detail"]
    assert "graphene token alice" in body["detail"]
    assert refused["WWW-Authenticate"].startswith("Token")
    assert set(body) == {"error", "detail", "fields"}


def test_revoking_ones_token_refuses_it_from_the_next_request(user: Any) -> None:
    key = api_token(user)
    own = client(key)
    token_id = own.get("/api/v1/tokens/").json()["results"][0]["id"]
    revoked = own.delete(f"/api/v1/tokens/{token_id}/")
    assert revoked.status_code == 200
    assert revoked.json()["status"] == "revoked"
    refused = own.get("/api/v1/tokens/")
    assert refused.status_code == 401
    assert refused.json()["error"] == "token_revoked"
    assert "was revoked at" in refused.json()["detail"]
    # Revoking again changes nothing (with another token of the same user).
    again = client(api_token(user)).delete(f"/api/v1/tokens/{token_id}/")
    assert again.status_code == 200
    assert again.json()["revoked_at"] == revoked.json()["revoked_at"]


def test_an_unknown_or_malformed_token_is_refused_saying_so(user: Any) -> None:
    unknown = whoami("grt_" + "x" * 43)
    assert unknown.status_code == 401
    assert unknown.json()["error"] == "authentication_failed"
    assert "not known to this server" in unknown.json()["detail"]
    assert client().get("/api/v1/whoami/", HTTP_AUTHORIZATION="Token").status_code == 401
    assert client().get("/api/v1/whoami/", HTTP_AUTHORIZATION="Token a b").status_code == 401
    assert client().get("/api/v1/whoami/").status_code == 401


def test_an_inactive_users_token_is_refused(user: Any) -> None:
    key = api_token(user)
    user.is_active = False
    user.save()
    refused = whoami(key)
    assert refused.status_code == 401
    assert refused.json()["error"] == "user_inactive"
    assert "'alice', which is inactive" in refused.json()["detail"]


def test_last_use_is_written_at_most_once_a_minute(user: Any) -> None:
    key = api_token(user)
    row = AccessToken.objects.get(user=user)
    assert row.last_used_at is None
    assert whoami(key).status_code == 200
    first = AccessToken.objects.get(pk=row.pk).last_used_at
    assert first is not None
    assert whoami(key).status_code == 200
    assert AccessToken.objects.get(pk=row.pk).last_used_at == first  # no write within the minute
    earlier = timezone.now() - timedelta(seconds=61)
    AccessToken.objects.filter(pk=row.pk).update(last_used_at=earlier)
    assert whoami(key).status_code == 200
    used = AccessToken.objects.get(pk=row.pk).last_used_at
    assert used is not None
    assert used > earlier


def test_own_tokens_are_ones_own(user: Any, django_user_model: Any) -> None:
    bob = django_user_model.objects.create_user(username="bob", password="pw")
    bobs = client(api_token(bob))
    bob_token = bobs.get("/api/v1/tokens/").json()["results"][0]["id"]
    alice = client(api_token(user))
    assert alice.get(f"/api/v1/tokens/{bob_token}/").status_code == 404
    assert alice.delete(f"/api/v1/tokens/{bob_token}/").status_code == 404
    assert [t["id"] for t in alice.get("/api/v1/tokens/").json()["results"]] != [bob_token]
    assert bobs.get("/api/v1/whoami/").status_code == 200
    # A non-superuser manages no service accounts.
    assert alice.get("/api/v1/accounts/").status_code == 403
    assert alice.post("/api/v1/accounts/", {"name": "ci"}, format="json").status_code == 403
    assert not ServiceAccount.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"expires_in_seconds": 0}, "expires_in_seconds"),
        ({"expires_in_seconds": 366 * 86400}, "expires_in_seconds"),
        ({"expires_in_seconds": "60"}, "expires_in_seconds"),
        ({"expires_in_seconds": 60.0}, "expires_in_seconds"),
        ({"expires_in_seconds": True}, "expires_in_seconds"),
        ({"comment": "x" * 201}, "comment"),
        ({"comment": 5}, "comment"),
        ({"expires_in": 60}, "expires_in"),
    ],
)
def test_a_bad_token_request_names_its_field_and_creates_nothing(user: Any, body: dict[str, Any], field: str) -> None:
    api = client(api_token(user))
    refused = api.post("/api/v1/tokens/", body, format="json")
    assert refused.status_code == 400, refused.content
    assert field in refused.json()["fields"], refused.json()
    assert AccessToken.objects.filter(user=user).count() == 1


# --- service accounts ------------------------------------------------------------------------------


def test_a_service_account_is_a_user_of_its_own_with_its_own_tokens(admin: APIClient, root: Any) -> None:
    created = admin.post("/api/v1/accounts/", {"name": "ci", "description": "github actions"}, format="json")
    assert created.status_code == 201, created.content
    account = created.json()
    assert account["username"] == "system:serviceaccount:default:ci"
    assert account["namespace"] == "default"
    assert account["created_by"] == "root"
    assert account["live_tokens"] == 0
    row = ServiceAccount.objects.select_related("user").get(name="ci")
    assert not row.user.has_usable_password()
    assert not row.user.is_staff
    assert not row.user.is_superuser

    issued = admin.post("/api/v1/accounts/ci/tokens/", {"comment": "deploy"}, format="json")
    assert issued.status_code == 201, issued.content
    assert issued["Cache-Control"] == "no-store"
    key = issued.json()["key"]
    # A service account's token defaults to GRAPHENE_SERVICE_ACCOUNT_TOKEN_TTL_DAYS (90).
    left = at(issued.json()["expires_at"]) - datetime.now(UTC)
    assert timedelta(days=89, hours=23) < left <= timedelta(days=90)
    assert stored_anywhere(key) == []

    who = whoami(key).json()
    assert who["username"] == "system:serviceaccount:default:ci"
    assert who["is_staff"] is False
    sa = client(key)
    # It sees and revokes its own tokens, but mints none: an administrator issues them.
    assert [t["comment"] for t in sa.get("/api/v1/tokens/").json()["results"]] == ["deploy"]
    refused = sa.post("/api/v1/tokens/", {}, format="json")
    assert refused.status_code == 403
    assert "graphenectl account token" in refused.json()["detail"]
    assert sa.get("/api/v1/accounts/").status_code == 403

    listed = admin.get("/api/v1/accounts/").json()["results"]
    assert [(a["name"], a["live_tokens"]) for a in listed] == [("ci", 1)]
    tokens = admin.get("/api/v1/accounts/ci/tokens/").json()["results"]
    assert [(t["comment"], t["status"], t["created_by"]) for t in tokens] == [("deploy", "active", "root")]
    assert key not in admin.get("/api/v1/accounts/ci/tokens/").content.decode()

    # Revoking one token refuses it at once.
    assert admin.delete(f"/api/v1/accounts/ci/tokens/{tokens[0]['id']}/").json()["status"] == "revoked"
    assert whoami(key).json()["error"] == "token_revoked"


def test_an_explicit_expiry_and_its_bound(admin: APIClient, settings: Any) -> None:
    admin.post("/api/v1/accounts/", {"name": "ci"}, format="json")
    issued = admin.post("/api/v1/accounts/ci/tokens/", {"expires_in_seconds": 30 * 86400}, format="json").json()
    assert timedelta(days=29, hours=23) < at(issued["expires_at"]) - datetime.now(UTC) <= timedelta(days=30)
    settings.GRAPHENE_TOKEN_MAX_TTL_DAYS = 10
    too_long = admin.post("/api/v1/accounts/ci/tokens/", {"expires_in_seconds": 11 * 86400}, format="json")
    assert too_long.status_code == 400
    assert "10 days" in too_long.json()["detail"]
    assert "GRAPHENE_TOKEN_MAX_TTL_DAYS" in too_long.json()["detail"]


def test_deleting_a_service_account_disables_it_and_refuses_its_tokens_at_once(admin: APIClient) -> None:
    admin.post("/api/v1/accounts/", {"name": "deployer"}, format="json")
    keys = [admin.post("/api/v1/accounts/deployer/tokens/", {}, format="json").json()["key"] for _ in range(2)]
    assert all(whoami(key).status_code == 200 for key in keys)

    deleted = admin.delete("/api/v1/accounts/deployer/")
    assert deleted.status_code == 200
    assert deleted.json()["revoked_tokens"] == 2
    assert deleted.json()["account"]["disabled_at"]
    for key in keys:
        refused = whoami(key)
        assert refused.status_code == 401
        assert "the service account was deleted" in refused.json()["detail"]
    account = ServiceAccount.objects.select_related("user").get(name="deployer")
    assert not account.user.is_active

    # It stays listed as deleted; it gets no new token; its name is not given to a new account.
    assert admin.get("/api/v1/accounts/").json()["results"][0]["disabled_at"]
    no_token = admin.post("/api/v1/accounts/deployer/tokens/", {}, format="json")
    assert no_token.status_code == 409
    again = admin.post("/api/v1/accounts/", {"name": "deployer"}, format="json")
    assert again.status_code == 409
    assert "names are not reused" in again.json()["detail"]
    assert admin.delete("/api/v1/accounts/deployer/").json()["revoked_tokens"] == 0


def test_a_deleted_accounts_token_that_escaped_revocation_is_still_refused(admin: APIClient) -> None:
    """The account's state is checked on its own, not only through its tokens' revocation."""
    admin.post("/api/v1/accounts/", {"name": "bot"}, format="json")
    key = admin.post("/api/v1/accounts/bot/tokens/", {}, format="json").json()["key"]
    ServiceAccount.objects.filter(name="bot").update(disabled_at=timezone.now())
    refused = whoami(key)
    assert refused.status_code == 401
    assert refused.json()["error"] == "account_disabled"
    assert "service account default/bot, which was deleted at" in refused.json()["detail"]


def test_namespaces_keep_names_apart(admin: APIClient) -> None:
    missing = admin.post("/api/v1/accounts/?namespace=team-a", {"name": "ci"}, format="json")
    assert missing.status_code == 404
    assert "graphenectl namespace create team-a" in missing.json()["detail"]
    factories.bind_namespace("team-a")
    factories.bind_namespace("team-b")
    assert admin.post("/api/v1/accounts/?namespace=team-a", {"name": "ci"}, format="json").status_code == 201
    assert admin.post("/api/v1/accounts/?namespace=team-b", {"name": "ci"}, format="json").status_code == 201
    assert admin.post("/api/v1/accounts/?namespace=team-a", {"name": "ci"}, format="json").status_code == 409
    listed = admin.get("/api/v1/accounts/?namespace=team-a").json()["results"]
    assert [(a["namespace"], a["username"]) for a in listed] == [("team-a", "system:serviceaccount:team-a:ci")]
    assert admin.get("/api/v1/accounts/").json()["results"] == []
    assert admin.get("/api/v1/accounts/ci/").status_code == 404
    missing = admin.get("/api/v1/accounts/ci/?namespace=team-c")
    assert missing.status_code == 404
    assert "no service account 'ci' in namespace 'team-c'" in missing.json()["detail"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/accounts/", {"name": "CI"}, "name"),
        ("/api/v1/accounts/", {"name": "-ci"}, "name"),
        ("/api/v1/accounts/", {"name": "c" * 64}, "name"),
        ("/api/v1/accounts/", {"name": "a.b"}, "name"),
        ("/api/v1/accounts/", {"name": 5}, "name"),
        ("/api/v1/accounts/", {}, "name"),
        ("/api/v1/accounts/", {"name": "ci", "descripton": "typo"}, "descripton"),
        ("/api/v1/accounts/", {"name": "ci", "description": "d" * 501}, "description"),
        ("/api/v1/accounts/?namespace=Team", {"name": "ci"}, "namespace"),
        ("/api/v1/accounts/?namespace=", {"name": "ci"}, "namespace"),
    ],
)
def test_a_bad_account_request_names_its_field_and_creates_nothing(
    admin: APIClient, path: str, body: dict[str, Any], field: str
) -> None:
    refused = admin.post(path, body, format="json")
    assert refused.status_code == 400, refused.content
    assert field in refused.json()["fields"], refused.json()
    assert not ServiceAccount.objects.exists()


def test_a_namespace_admin_manages_the_accounts_of_its_namespace_only(admin: APIClient, django_user_model: Any) -> None:
    """Service accounts are the access module's ``accounts``: the ``admin`` role grants them in
    the namespace it is bound in; a developer gets none; a user's own tokens need no role."""
    factories.bind_namespace("team-a")
    admin.post("/api/v1/accounts/", {"name": "ci"}, format="json")
    ann = django_user_model.objects.create_user(username="ann", password="pw")
    factories.bind(ann, "admin", "team-a")
    dev = django_user_model.objects.create_user(username="dev", password="pw")
    factories.bind(dev, "developer", "team-a")
    as_ann, as_dev = client(api_token(ann)), client(api_token(dev))

    assert as_ann.post("/api/v1/accounts/?namespace=team-a", {"name": "deployer"}, format="json").status_code == 201
    key = as_ann.post("/api/v1/accounts/deployer/tokens/?namespace=team-a", {}, format="json").json()["key"]
    assert whoami(key).json()["username"] == "system:serviceaccount:team-a:deployer"
    assert [a["name"] for a in as_ann.get("/api/v1/accounts/?namespace=team-a").json()["results"]] == ["deployer"]
    refused = as_ann.get("/api/v1/accounts/")  # the default namespace's: not hers
    assert refused.status_code == 403
    assert "may not list accounts in namespace 'default'" in refused.json()["detail"]
    assert as_ann.post("/api/v1/accounts/ci/tokens/", {}, format="json").status_code == 403
    assert as_ann.delete("/api/v1/accounts/ci/tokens/").status_code == 403

    for method, path in (
        ("get", "/api/v1/accounts/?namespace=team-a"),
        ("post", "/api/v1/accounts/deployer/tokens/?namespace=team-a"),
        ("delete", "/api/v1/accounts/deployer/?namespace=team-a"),
    ):
        assert getattr(as_dev, method)(path, format="json").status_code == 403, (method, path)
    assert as_dev.post("/api/v1/tokens/", {"comment": "mine"}, format="json").status_code == 201
    assert whoami(key).status_code == 200  # nothing the developer tried went through


def test_graphene_token_refuses_a_service_accounts_user(root: Any) -> None:
    account = services.service_account_create(name="ci", actor=root)
    with pytest.raises(services.ValidationFailed) as refused:
        services.user_token_issue(username=account.user.username)
    assert "graphenectl account token ci --namespace default" in refused.value.detail


def test_listing_accounts_costs_the_same_queries_for_one_or_many(
    admin: APIClient, root: Any, django_assert_max_num_queries: Any
) -> None:
    """A committed query budget: the list is one page query (plus authentication), however many
    accounts and tokens there are."""
    for i in range(12):
        account = services.service_account_create(name=f"bot-{i}", actor=root)
        services.service_account_token_issue(account=account)
    with django_assert_max_num_queries(4):
        listed = admin.get("/api/v1/accounts/?limit=50")
    assert len(listed.json()["results"]) == 12
    assert all(a["live_tokens"] == 1 for a in listed.json()["results"])
    with django_assert_max_num_queries(5):
        tokens = admin.get("/api/v1/accounts/bot-3/tokens/")
    assert len(tokens.json()["results"]) == 1


def test_the_first_admins_token_is_renewed_in_its_file_once_it_no_longer_authenticates(tmp_path: Any) -> None:
    """``graphene up``: the credentials file is how an embedded installation's owner gets in, so
    a start after the saved token expired puts a new one in it (the password stays)."""
    first = services.admin_bootstrap(data_dir=tmp_path)
    assert first.created
    assert first.token is not None
    saved = json.loads((tmp_path / "admin-credentials.json").read_text())
    assert saved["token"] == first.token
    assert whoami(first.token).status_code == 200

    again = services.admin_bootstrap(data_dir=tmp_path)
    assert (again.created, again.renewed, again.token) == (False, False, None)  # still good: untouched
    assert json.loads((tmp_path / "admin-credentials.json").read_text()) == saved

    AccessToken.objects.filter(user__username="admin").update(expires_at=timezone.now() - timedelta(seconds=1))
    renewed = services.admin_bootstrap(data_dir=tmp_path)
    assert renewed.renewed
    assert renewed.token is not None
    now_saved = json.loads((tmp_path / "admin-credentials.json").read_text())
    assert now_saved == {**saved, "token": renewed.token}
    assert oct((tmp_path / "admin-credentials.json").stat().st_mode & 0o777) == "0o600"
    assert whoami(renewed.token).status_code == 200
    assert whoami(first.token).json()["error"] == "token_expired"
