"""Websockets opened with a token, against the real web server (daphne, the Redis channel layer):
a token that does not authenticate is refused with its reason; a token revoked, expired or
whose service account is deleted while its sockets are open closes them at once (4401, after a
message saying why), and leaves the sockets of other tokens alone. A socket whose database call
waits holds up no other socket."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection
from websockets.typing import Origin

from apps.accounts import services
from apps.accounts.models import AccessToken
from apps.core.events import publish_on_commit
from tests import factories
from tests.factories import api_token
from tests.harness.net import http
from tests.harness.wait import wait_for
from tests.harness.web import WebServer
from tests.harness.ws import open_ws

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

# Well under the watcher's look at the token's row (RECHECK_SECONDS, 60): a close within this is
# the revocation message's doing, or the expiry timer's.
PROMPTLY = 15.0


def open_socket(web: WebServer, token: str, path: str = "ws/runs/", timeout: float = 5) -> ClientConnection:
    return open_ws(
        f"{web.ws_url}/{path}",
        log=web.log,
        timeout=timeout,
        origin=Origin(web.url),
        additional_headers={"Authorization": f"Token {token}"},
    )


def ending(ws: ClientConnection, timeout: float = PROMPTLY) -> tuple[dict[str, Any] | None, int | None, float]:
    """The error message the server sends before it closes, its close code, and how long it took."""
    began = time.monotonic()
    deadline = began + timeout
    error = None
    try:
        while True:
            message = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if message.get("type") == "error":
                error = message
    except ConnectionClosed:
        pass
    except TimeoutError:
        raise AssertionError(f"the socket stayed open {timeout}s") from None
    return error, ws.close_code, time.monotonic() - began


def still_open(ws: ClientConnection, group: str = "runs.default") -> bool:
    """A hint sent to the socket's group (a viewer of the default namespace joins its groups)
    reaches it: it is open and served."""
    probe = f"probe-{time.monotonic_ns()}"
    publish_on_commit(group, {"event": "run.updated", "id": probe})
    deadline = time.monotonic() + PROMPTLY
    while True:  # other hints of the group may come first (the web's own, another test's)
        if json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic()))).get("id") == probe:
            return True


@pytest.fixture
def alice(django_user_model: Any) -> Any:
    """A viewer: she may watch runs and records."""
    user = django_user_model.objects.create_user(username="alice", password="pw")
    factories.bind(user, "viewer")
    return user


def test_a_token_that_does_not_authenticate_is_refused_with_its_reason(web: WebServer, alice: Any) -> None:
    expired = api_token(alice)
    AccessToken.objects.filter(user=alice).update(expires_at=timezone.now() - timedelta(seconds=1))
    error, code, _ = ending(open_socket(web, expired))
    assert code == 4401
    assert error is not None
    assert error["reason"] == "token_expired"
    assert "expired at" in error["error"]
    assert "graphene token alice" in error["error"]

    error, code, _ = ending(open_socket(web, "grt_" + "n" * 43, "ws/records/"))
    assert code == 4401
    assert error is not None
    assert "not known to this server" in error["error"]


def test_revoking_a_token_closes_the_websockets_it_opened_at_once(web: WebServer, alice: Any) -> None:
    doomed, other = api_token(alice, comment="doomed"), api_token(alice, comment="other")
    runs = open_socket(web, doomed)
    records = open_socket(web, doomed, "ws/records/")
    kept = open_socket(web, other)
    assert still_open(runs)
    assert still_open(records, "records.default")

    # Revoked over REST, with the other token: the web server tells the sockets of this one.
    token_id = str(AccessToken.objects.get(user=alice, comment="doomed").pk)
    status, body = http("DELETE", f"{web.url}/api/v1/tokens/{token_id}/", token=other)
    assert status == 200, body
    for ws in (runs, records):
        error, code, took = ending(ws)
        assert code == 4401
        assert error is not None
        assert error["reason"] == "token_revoked"
        assert "was revoked at" in error["error"]
        assert took < PROMPTLY
        print(f"closed {took:.3f}s after the revocation answered")
    assert still_open(kept)  # another token's socket stays
    kept.close()


def test_deleting_a_service_account_closes_its_websockets(web: WebServer, alice: Any) -> None:
    account = services.service_account_create(name="watcher")
    factories.bind(account.user, "viewer")  # it gets rights as any user does
    key = services.service_account_token_issue(account=account).key
    ws = open_socket(web, key)
    assert still_open(ws)
    services.service_account_delete(account=account)  # from this process, through Redis
    error, code, _ = ending(ws)
    assert code == 4401
    assert error is not None
    assert "the service account was deleted" in error["error"]


def test_a_token_that_expires_while_connected_closes_its_websocket(web: WebServer, alice: Any) -> None:
    key = api_token(alice, expires_in=timedelta(seconds=12))  # outlives an open tried twice
    ws = open_socket(web, key)
    assert still_open(ws)
    error, code, _ = ending(ws)
    assert code == 4401
    assert error is not None
    assert error["reason"] == "token_expired"
    assert AccessToken.objects.get(user=alice).expires_at <= timezone.now()


def _waiting_on_a_lock(table: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE %s",
            [f'UPDATE "{table}"%'],
        )
        return bool(cursor.fetchone()[0])


def test_a_socket_whose_database_call_waits_holds_up_no_other_socket(web: WebServer, alice: Any) -> None:
    """The web process's sockets reach the database on threads of their own: one that waits on a
    row lock (here its token's, held by another transaction) does not keep another socket from
    opening and being served, as Channels' one shared database thread did."""
    stuck_key, free_key = api_token(alice, comment="stuck"), api_token(alice, comment="free")
    row = AccessToken.objects.get(user=alice, comment="stuck").pk
    locked, release = threading.Event(), threading.Event()

    def hold_the_row() -> None:
        try:
            with transaction.atomic():
                list(AccessToken.objects.select_for_update().filter(pk=row))
                locked.set()
                release.wait(60)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    opened: list[ClientConnection] = []
    opener = threading.Thread(target=lambda: opened.append(open_socket(web, stuck_key, timeout=10)))
    try:
        assert locked.wait(15)
        opener.start()
        # Its authentication notes the token's first use: an UPDATE of the locked row, waiting.
        wait_for(lambda: _waiting_on_a_lock(AccessToken._meta.db_table), timeout=30, what="the stuck socket's UPDATE")
        began = time.monotonic()
        free = open_socket(web, free_key, "ws/records/", timeout=PROMPTLY)
        assert still_open(free, "records.default")
        print(f"another socket opened and was served in {time.monotonic() - began:.3f}s")
        assert opened == []  # the stuck one still waits
    finally:
        release.set()
        holder.join(30)
    opener.join(30)
    assert len(opened) == 1
    assert still_open(opened[0])
    free.close()
    opened[0].close()
