"""``graphene token USERNAME``: prints the user's API token, the same one each time unless
``--rotate``; ``--create-user`` makes an API-only account; a missing user is one line naming the
way out. The token it prints authenticates against the API."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.authtoken.models import Token

import graphene_project
from graphene_project.cli import main
from tests.harness.processes import REPO, process_env
from tests.test_foundation import graphene


def _token(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, str]:
    """``graphene token ARGS`` in this process: its stdout and stderr."""
    main(["token", *args])
    out, err = capsys.readouterr()
    return out, err


def _whoami(token: str) -> tuple[int, Any]:
    response = Client().get("/api/v1/whoami/", HTTP_AUTHORIZATION=f"Token {token}")
    return response.status_code, response.json()


@pytest.mark.django_db
def test_the_token_is_printed_alone_and_is_the_same_each_time(capsys: pytest.CaptureFixture[str]) -> None:
    get_user_model().objects.create_user(username="ops", password="a-long-password-1")
    out, err = _token(capsys, "ops")
    token = out.strip()
    assert out == f"{token}\n"  # alone on stdout: TOKEN=$(graphene token ops)
    assert len(token) == 40
    assert "created a token for 'ops'" in err
    assert _whoami(token) == (
        200,
        {"username": "ops", "is_staff": False, "server_version": graphene_project.__version__},
    )

    again, err = _token(capsys, "ops")
    assert again == out
    assert err == ""  # nothing changed
    assert Token.objects.filter(user__username="ops").count() == 1


@pytest.mark.django_db
def test_rotate_replaces_the_token_and_the_old_one_stops_working(capsys: pytest.CaptureFixture[str]) -> None:
    get_user_model().objects.create_user(username="ops", password="a-long-password-1")
    old = _token(capsys, "ops")[0].strip()
    out, err = _token(capsys, "ops", "--rotate")
    new = out.strip()
    assert new != old
    assert "the previous one no longer authenticates" in err
    assert _whoami(old)[0] == 401
    assert _whoami(new)[0] == 200
    assert _token(capsys, "ops")[0].strip() == new


@pytest.mark.django_db
def test_create_user_makes_an_api_only_account_once(capsys: pytest.CaptureFixture[str]) -> None:
    out, err = _token(capsys, "ci-bot", "--create-user", "-o", "json")
    issued = json.loads(out)
    assert issued == {
        "username": "ci-bot",
        "token": issued["token"],
        "created_user": True,
        "created_token": True,
        "rotated": False,
    }
    assert "created user 'ci-bot' (API only: no password, not staff)" in err
    user = get_user_model().objects.get(username="ci-bot")
    assert not user.has_usable_password()
    assert not user.is_staff
    assert _whoami(issued["token"])[0] == 200

    again = json.loads(_token(capsys, "ci-bot", "--create-user", "-o", "json")[0])
    assert again == {**issued, "created_user": False, "created_token": False}
    assert get_user_model().objects.filter(username="ci-bot").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["nobody"], "no user 'nobody': create one with 'graphene manage createsuperuser', or pass --create-user"),
        (["bad name!", "--create-user"], "cannot create user 'bad name!': Enter a valid username."),
        (["gone"], "user 'gone' is inactive"),
    ],
)
def test_a_token_that_cannot_be_given_is_one_line_and_changes_nothing(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    get_user_model().objects.create_user(username="gone", password="a-long-password-1", is_active=False)
    users = get_user_model().objects.count()
    with pytest.raises(SystemExit) as exited:
        main(["token", *args])
    out, err = capsys.readouterr()
    assert exited.value.code == 2
    assert out == ""
    assert err.startswith(f"graphene: error: {says}"), err
    assert len(err.strip().splitlines()) == 1
    assert get_user_model().objects.count() == users
    assert not Token.objects.exists()


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
    assert _whoami(token) == (
        200,
        {"username": "admin", "is_staff": True, "server_version": graphene_project.__version__},
    )
    assert run("token", "admin").stdout == printed.stdout
