"""The Studio shows service accounts and tokens (never a key) and revokes tokens through the
service: a token revoked there is refused from the next request on."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from apps.accounts import services
from apps.accounts.models import AccessToken

pytestmark = pytest.mark.django_db


@pytest.fixture
def studio(django_user_model: Any) -> Client:
    user = django_user_model.objects.create_superuser(username="ada", password="pw")
    client = Client()
    client.force_login(user)
    return client


def test_tokens_are_listed_without_their_keys_and_revoked_from_the_list(studio: Client) -> None:
    account = services.service_account_create(name="ci", description="github actions")
    issued = services.service_account_token_issue(account=account, comment="actions")
    accounts_page = studio.get("/accounts/serviceaccount/")
    assert accounts_page.status_code == 200
    assert "github actions" in accounts_page.content.decode()
    page = studio.get("/accounts/accesstoken/")
    assert page.status_code == 200
    html = page.content.decode()
    assert issued.token.prefix in html
    assert "actions" in html
    assert issued.key not in html
    assert issued.token.digest not in html
    detail = studio.get(f"/accounts/accesstoken/{issued.token.pk}/change/").content.decode()
    assert issued.token.digest not in detail
    assert studio.get("/accounts/accesstoken/add/").status_code == 403

    done = studio.post(
        "/accounts/accesstoken/",
        {"action": "revoke_tokens", "_selected_action": [str(issued.token.pk)]},
        follow=True,
    )
    assert "Revoked 1 token(s)" in done.content.decode()
    row = AccessToken.objects.get(pk=issued.token.pk)
    assert row.revoked_reason == "revoked in the Studio"
    api = Client().get("/api/v1/whoami/", HTTP_AUTHORIZATION=f"Token {issued.key}")
    assert api.status_code == 401
    assert api.json()["error"] == "token_revoked"
