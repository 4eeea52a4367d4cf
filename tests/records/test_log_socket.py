"""A record's log, live over a Channels websocket (``ws/records/<id>/logs/``)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from apps.observability.services import log_write
from graphene_project.routing import websocket_urlpatterns
from tests import factories
from tests.conftest import WithUser

pytestmark = pytest.mark.django_db(transaction=True)


def test_lines_arrive_as_they_are_written_filtered_and_from_the_tail(user: Any, api: Any) -> None:
    run = factories.run()
    child = factories.sleep(run, "child")
    log_write(record_id=run.pk, message="before 1")
    log_write(record_id=run.pk, message="before 2")

    async def follow() -> tuple[list[str], list[str], list[Any]]:
        app = WithUser(URLRouter(websocket_urlpatterns), user)
        everything = WebsocketCommunicator(app, f"/ws/records/{run.pk}/logs/")
        errors_from_tail = WebsocketCommunicator(app, f"/ws/records/{run.pk}/logs/?tail=1&severity=warning")
        assert (await everything.connect())[0]
        assert (await errors_from_tail.connect())[0]
        await sync_to_async(log_write)(record_id=child.pk, message="child says hi")
        await sync_to_async(log_write)(record_id=child.pk, message="child is on fire", severity="error")
        seen: list[str] = []
        batches: list[Any] = []
        while len(seen) < 4:
            batch = await everything.receive_json_from(timeout=10)
            batches.append(batch)
            seen += [line["message"] for line in batch["lines"]]
        warned = [line["message"] for line in (await errors_from_tail.receive_json_from(timeout=10))["lines"]]
        for communicator in (everything, errors_from_tail):
            await communicator.disconnect()
        return seen, warned, batches

    seen, warned, batches = async_to_sync(follow)()
    assert seen == ["before 1", "before 2", "child says hi", "child is on fire"]
    assert warned == ["child is on fire"]
    rest = api.get(f"/api/v1/records/{run.pk}/logs/").json()["results"]
    assert [line for batch in batches for line in batch["lines"]] == rest, "the REST shape, each line once"


def test_bad_requests_are_refused_with_a_reason(user: Any) -> None:
    run = factories.run()

    async def attempt(path: str, who: Any) -> tuple[Any, Any]:
        communicator = WebsocketCommunicator(WithUser(URLRouter(websocket_urlpatterns), who), path)
        connected, code = await communicator.connect()
        if not connected:
            return None, code
        message = await communicator.receive_json_from(timeout=10)
        closed = await communicator.receive_output(timeout=10)
        return message, closed.get("code")

    assert async_to_sync(attempt)(f"/ws/records/{run.pk}/logs/", AnonymousUser()) == (None, 4401)
    message, code = async_to_sync(attempt)(f"/ws/records/{uuid.uuid4()}/logs/", user)
    assert code == 4404
    assert "no record" in message["error"]
    message, code = async_to_sync(attempt)(f"/ws/records/{run.pk}/logs/?tail=0", user)
    assert code == 4400
    assert "tail" in message["fields"]
    message, code = async_to_sync(attempt)(f"/ws/records/{run.pk}/logs/?severity=loud", user)
    assert (code, list(message["fields"])) == (4400, ["severity"])
