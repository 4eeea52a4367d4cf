"""Failed authentications are limited (apps/core/throttle.py): per client address at the API's
token check and on websockets, per address and per username at the Studio's login form. Past
the limit the answer is 429 with ``Retry-After`` until the window ends; whoever authenticates
is never counted."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Origin

from apps.core import throttle
from tests.factories import api_token
from tests.harness.net import fetch_response
from tests.harness.web import CHANNEL_LAYER_URL, WebServer
from tests.harness.ws import open_ws

LIMIT = 10  # the default (settings/base.py), which the test settings keep


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """The limiter's clock, at the start of a window; ``advance(seconds)`` moves it on."""
    now = [60.0 * 16_667 + 20]  # 20 s into a window of 60
    monkeypatch.setattr(throttle, "_now", lambda: now[0])

    def advance(seconds: float) -> None:
        now[0] += seconds

    return advance


def api_get(client: Client, token: str, address: str = "127.0.0.1") -> Any:
    return client.get("/api/v1/runs/", HTTP_AUTHORIZATION=f"Token {token}", REMOTE_ADDR=address)


@pytest.mark.django_db
def test_bad_tokens_past_the_limit_are_refused_429_until_the_window_ends(
    client: Client, user: Any, clock: Callable[[float], None]
) -> None:
    good = api_token(user)
    for _ in range(3 * LIMIT):  # successes are never counted
        assert api_get(client, good).status_code == 200
    for _ in range(LIMIT):
        assert api_get(client, "wrong").status_code == 401
    refused = api_get(client, "wrong")
    assert refused.status_code == 429
    assert refused["Retry-After"] == "40"  # the window started 20 s ago
    body = json.loads(refused.content)
    assert body == {
        "error": "throttled",
        "detail": "too many failed authentications from this address (more than 10 a minute); try again in 40 s",
        "fields": {},
    }
    # The address is refused before its credentials are judged: a good token waits too.
    assert api_get(client, good).status_code == 429
    # Another address is another count.
    assert api_get(client, good, address="10.0.0.2").status_code == 200
    assert api_get(client, "wrong", address="10.0.0.2").status_code == 401

    clock(39)
    assert api_get(client, good).status_code == 429
    assert api_get(client, good).status_code == 429
    clock(1)  # the next window
    assert api_get(client, good).status_code == 200
    assert api_get(client, "wrong").status_code == 401


@pytest.mark.django_db
def test_a_studio_session_is_never_refused_at_the_api(
    client: Client, user: Any, django_user_model: Any, clock: Callable[[float], None]
) -> None:
    for _ in range(LIMIT):
        api_get(client, "wrong")
    assert api_get(client, "wrong").status_code == 429
    studio = Client()
    studio.force_login(django_user_model.objects.create_superuser(username="ada", password="pw"))
    assert studio.get("/api/v1/runs/", REMOTE_ADDR="127.0.0.1").status_code == 200


@pytest.mark.django_db
def test_the_address_is_the_peer_unless_a_trusted_proxy_forwarded_it(settings: Any, client: Client) -> None:
    assert throttle.client_address(peer="203.0.113.9", forwarded_for="198.51.100.1") == "203.0.113.9"
    settings.GRAPHENE_TRUSTED_PROXIES = ["10.0.0.0/8"]
    assert throttle.client_address(peer="203.0.113.9", forwarded_for="198.51.100.1") == "203.0.113.9"
    assert throttle.client_address(peer="10.1.1.1", forwarded_for="198.51.100.1, 10.2.2.2") == "198.51.100.1"
    assert throttle.client_address(peer="10.1.1.1", forwarded_for="spoofed, 198.51.100.1") == "198.51.100.1"
    assert throttle.client_address(peer="10.1.1.1", forwarded_for="10.3.3.3") == "10.1.1.1"
    assert throttle.client_address(peer=None) == "unknown"
    # Through a trusted proxy, clients behind it are counted apart.
    for _ in range(LIMIT):
        api_get(client, "wrong", address="10.1.1.1")
    assert api_get(client, "wrong", address="10.1.1.1").status_code == 429
    forwarded = client.get(
        "/api/v1/runs/", HTTP_AUTHORIZATION="Token wrong", REMOTE_ADDR="10.9.9.9", HTTP_X_FORWARDED_FOR="198.51.100.7"
    )
    assert forwarded.status_code == 401


@pytest.mark.django_db
def test_off_at_zero(client: Client, settings: Any) -> None:
    settings.GRAPHENE_AUTH_FAILURES_PER_MINUTE = 0
    assert {api_get(client, "wrong").status_code for _ in range(3 * LIMIT)} == {401}


# --- the Studio's login form ---------------------------------------------------------------------


def log_in(client: Client, username: str, password: str, address: str = "127.0.0.1") -> Any:
    return client.post(
        "/login/?next=/runs/", {"username": username, "password": password, "next": "/runs/"}, REMOTE_ADDR=address
    )


@pytest.mark.django_db
def test_failed_logins_past_the_limit_get_a_429_page_saying_when(
    client: Client, django_user_model: Any, clock: Callable[[float], None]
) -> None:
    django_user_model.objects.create_superuser(username="ada", password="right")
    for _ in range(3 * LIMIT):  # successful logins are never counted
        assert log_in(Client(), "ada", "right").status_code == 302
    for _ in range(LIMIT):
        failed = log_in(client, "ada", "wrong")
        assert failed.status_code == 200
        assert "Please enter the correct username and password" in failed.content.decode()
    refused = log_in(client, "ada", "right")  # not even judged: the right password waits too
    assert refused.status_code == 429
    assert refused["Retry-After"] == "40"
    html = refused.content.decode()
    assert (
        '<p class="errornote" id="login-throttled" role="alert">Too many failed logins from this address or for '
        "this username: try again in 40 seconds.</p>"
    ) in html
    assert 'id="login-form"' in html  # the form is still there, for later
    assert 'value="ada"' in html
    assert 'name="next" value="/runs/"' in html
    assert "_auth_user_id" not in client.session
    assert client.get("/runs/").status_code == 302, "not logged in"

    clock(40)
    assert log_in(client, "ada", "right").status_code == 302
    assert client.get("/runs/").status_code == 200


@pytest.mark.django_db
def test_failed_logins_count_per_username_too(client: Client, django_user_model: Any) -> None:
    django_user_model.objects.create_superuser(username="ada", password="right")
    django_user_model.objects.create_superuser(username="bob", password="right")
    for n in range(LIMIT):  # one guess from each of many addresses
        assert log_in(Client(), "Ada", "wrong", address=f"10.0.0.{n + 1}").status_code == 200
    assert log_in(Client(), "ada", "right", address="10.0.1.1").status_code == 429
    assert log_in(Client(), "bob", "right", address="10.0.1.1").status_code == 302
    # The GET of the form is never refused.
    assert Client().get("/login/", REMOTE_ADDR="10.0.0.1").status_code == 200


# --- websockets (a server of its own: the limit it tests, counts no other test adds to) ----------


def ws_close(server: WebServer, token: str) -> int:
    """Open a websocket with a token; the code it is closed with, after what it was told (a
    refusal before accepting is a 403 to the handshake: 403)."""
    try:
        with open_ws(
            server.ws_url + "/ws/runs/",
            log=server.log,
            additional_headers={"Authorization": f"Token {token}"},
            origin=Origin(server.url),
        ) as socket:
            for _ in range(10):
                socket.recv(timeout=10)
    except InvalidStatus as refused:
        return refused.response.status_code
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else 1006
    raise AssertionError(f"{server.ws_url}/ws/runs/ was not closed")


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_websocket_refusals_count_and_refuse_with_4429(tmp_path: Any, redis_layer: None) -> None:
    server = WebServer(tmp_path, GRAPHENE_AUTH_FAILURES_PER_MINUTE="3").start()
    try:
        # An unknown token is accepted, told why and closed with 4401 (apps/accounts/websocket_auth.py).
        assert [ws_close(server, "wrong") for _ in range(3)] == [4401, 4401, 4401]
        # Refused before it is authenticated: accepted, so that the client reads the code.
        assert ws_close(server, "wrong") == 4429
        # One count per address, whatever door: the API refuses this address now as well.
        status, headers, body = fetch_response(f"{server.url}/api/v1/runs/", headers={"Authorization": "Token x"})
        assert status == 429
        assert 1 <= int(headers["Retry-After"]) <= 60
        assert json.loads(body)["error"] == "throttled"
    finally:
        server.kill()


@pytest.mark.django_db
def test_in_production_the_counts_are_in_redis_for_every_web_process(client: Client, settings: Any) -> None:
    """Production's cache (settings/base.py: the channel layer's Redis unless GRAPHENE_CACHE_URL
    says otherwise): what one web process counted, another reads; the counts expire."""
    import uuid

    import redis

    prefix = f"graphene-test-{uuid.uuid4().hex[:8]}"
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": CHANNEL_LAYER_URL,
            "KEY_PREFIX": prefix,
        }
    }
    for _ in range(LIMIT):
        assert api_get(client, "wrong", address="192.0.2.1").status_code == 401
    # A second client reads the same Redis, as a second web process would.
    assert api_get(Client(), "wrong", address="192.0.2.1").status_code == 429
    server = redis.Redis.from_url(CHANNEL_LAYER_URL)
    keys = server.keys(f"{prefix}:*")
    assert len(keys) == 1
    assert 0 < server.ttl(keys[0]) <= 2 * throttle.WINDOW_SECONDS
    assert b"192.0.2.1" not in keys[0], "addresses are stored as digests"
    server.delete(*keys)
