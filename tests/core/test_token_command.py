"""``graphene token USERNAME``: issues a new, expiring API token and prints it alone, once;
``--rotate`` revokes the user's earlier tokens; ``--create-user`` makes an API-only account; a
missing user is one line naming the way out. The token it prints authenticates against the API,
and the database holds only its digest."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client

import graphene_project
from apps.accounts.models import AccessToken
from graphene_project.cli import main
from tests.harness.processes import REPO, process_env
from tests.test_foundation import assert_one_line_error, clean_env, graphene, run_graphene


def _token(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, str]:
    """``graphene token ARGS`` in this process: its stdout and stderr."""
    main(["token", *args])
    out, err = capsys.readouterr()
    return out, err


def _whoami(token: str) -> tuple[int, Any]:
    response = Client().get("/api/v1/whoami/", HTTP_AUTHORIZATION=f"Token {token}")
    return response.status_code, response.json()


def _columns_hold(text: str) -> bool:
    """Whether ``text`` is anywhere in the accounts tables, in any column."""
    with connection.cursor() as cursor:
        for table in (AccessToken._meta.db_table, "accounts_serviceaccount"):
            cursor.execute(f"SELECT * FROM {table}")  # noqa: S608 - our own table names
            if any(text in str(value) for row in cursor.fetchall() for value in row):
                return True
    return False


@pytest.mark.django_db
def test_the_token_is_printed_alone_once_and_expires(capsys: pytest.CaptureFixture[str]) -> None:
    get_user_model().objects.create_user(username="ops", password="a-long-password-1")
    out, err = _token(capsys, "ops")
    token = out.strip()
    assert out == f"{token}\n"  # alone on stdout: TOKEN=$(graphene token ops)
    assert token.startswith("grt_")
    assert "issued a token for 'ops'" in err
    assert "it is shown only now" in err
    status, who = _whoami(token)
    assert status == 200
    assert who["username"] == "ops"
    assert who["server_version"] == graphene_project.__version__
    row = AccessToken.objects.get(user__username="ops")
    expires_at = datetime.fromisoformat(who["token_expires_at"].replace("Z", "+00:00"))
    assert expires_at == row.expires_at
    assert timedelta(days=89) < row.expires_at - datetime.now(UTC) <= timedelta(days=90)
    assert not _columns_hold(token)  # hashed at rest
    assert row.prefix == token[:12]

    # Each call issues another token (the first cannot be shown again); both work.
    again, _ = _token(capsys, "ops")
    assert again != out
    assert _whoami(again.strip())[0] == 200
    assert _whoami(token)[0] == 200
    assert AccessToken.objects.filter(user__username="ops").count() == 2


@pytest.mark.django_db
def test_expires_in_and_comment_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    get_user_model().objects.create_user(username="ops", password="a-long-password-1")
    issued = json.loads(_token(capsys, "ops", "--expires-in", "12h", "--comment", "laptop", "-o", "json")[0])
    assert set(issued) == {"username", "token", "id", "expires_at", "comment", "created_user", "revoked"}
    row = AccessToken.objects.get(pk=issued["id"])
    assert row.comment == "laptop"
    assert timedelta(hours=11, minutes=59) < row.expires_at - datetime.now(UTC) <= timedelta(hours=12)
    assert issued["expires_at"] == row.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.django_db
def test_rotate_revokes_the_earlier_tokens_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    get_user_model().objects.create_user(username="ops", password="a-long-password-1")
    old = _token(capsys, "ops")[0].strip()
    out, err = _token(capsys, "ops", "--rotate")
    new = out.strip()
    assert new != old
    assert "revoked 'ops''s 1 earlier token(s)" in err
    status, body = _whoami(old)
    assert status == 401
    assert body["error"] == "token_revoked"
    assert "replaced by graphene token --rotate" in body["detail"]
    assert _whoami(new)[0] == 200


@pytest.mark.django_db
def test_create_user_makes_an_api_only_account_once(capsys: pytest.CaptureFixture[str]) -> None:
    out, err = _token(capsys, "ci-bot", "--create-user", "-o", "json")
    issued = json.loads(out)
    assert issued["username"] == "ci-bot"
    assert issued["created_user"] is True
    assert issued["revoked"] == 0
    assert "created user 'ci-bot' (API only: no password, not staff)" in err
    user = get_user_model().objects.get(username="ci-bot")
    assert not user.has_usable_password()
    assert not user.is_staff
    assert _whoami(issued["token"])[0] == 200

    again = json.loads(_token(capsys, "ci-bot", "--create-user", "-o", "json")[0])
    assert again["created_user"] is False
    assert get_user_model().objects.filter(username="ci-bot").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["nobody"], "no user 'nobody': create one with 'graphene manage createsuperuser', or pass --create-user"),
        (["bad name!", "--create-user"], "cannot create user 'bad name!': Enter a valid username."),
        (["gone"], "user 'gone' is inactive"),
        (["gone", "--expires-in", "soon"], "--expires-in 'soon' is not a duration"),
        (["ops", "--expires-in", "400d"], "expires_in must be between 1 second and 365 days"),
    ],
)
def test_a_token_that_cannot_be_given_is_one_line_and_changes_nothing(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    get_user_model().objects.create_user(username="gone", password="a-long-password-1", is_active=False)
    get_user_model().objects.create_user(username="ops", password="a-long-password-1")
    users = get_user_model().objects.count()
    with pytest.raises(SystemExit) as exited:
        main(["token", *args])
    out, err = capsys.readouterr()
    assert exited.value.code == 2
    assert out == ""
    assert err.startswith(f"graphene: error: {says}"), err
    assert len(err.strip().splitlines()) == 1
    assert get_user_model().objects.count() == users
    assert not AccessToken.objects.exists()


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_the_readmes_first_user_and_token_commands_work(tmp_path: Path) -> None:
    """As the README's production set-up says: the first user, then its token, by the installed
    ``graphene`` command (its own process, the session's database)."""
    env = process_env(DJANGO_SUPERUSER_PASSWORD="a-long-password-1", DJANGO_SUPERUSER_EMAIL="admin@example.com")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*graphene(), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False
        )

    created = run("manage", "createsuperuser", "--noinput", "--username", "admin")
    assert created.returncode == 0, created.stderr
    printed = run("token", "admin")
    assert printed.returncode == 0, printed.stderr
    token = printed.stdout.strip()
    status, who = _whoami(token)
    assert status == 200
    assert (who["username"], who["is_staff"]) == ("admin", True)
    assert run("token", "admin").stdout != printed.stdout  # another token: none is shown twice


@pytest.mark.system
@pytest.mark.parametrize(
    ("setting", "value"),
    [("GRAPHENE_USER_TOKEN_TTL_DAYS", "400"), ("GRAPHENE_SERVICE_ACCOUNT_TOKEN_TTL_DAYS", "0")],
)
def test_a_token_lifetime_beyond_the_bound_stops_the_command_at_once(setting: str, value: str, tmp_path: Path) -> None:
    env = clean_env(tmp_path, DJANGO_SETTINGS_MODULE="graphene_project.settings.dev", **{setting: value})
    line = assert_one_line_error(run_graphene(["token", "admin"], env), setting)
    assert "must be between 1 and GRAPHENE_TOKEN_MAX_TTL_DAYS (365)" in line
