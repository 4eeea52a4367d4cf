"""The run watch stream (Channels websocket) and run deadlines."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from apps.pipelines import services
from apps.pipelines.choices import RunStatus
from apps.pipelines.models import Run
from apps.records.choices import Phase
from apps.records.models import Record
from graphene_project.routing import websocket_urlpatterns
from tests.conftest import WithUser, wait_for
from tests.harness.driver import Driver

pytestmark = pytest.mark.django_db(transaction=True)


def test_watch_stream_reports_status_changes(user: Any) -> None:
    run = services.run_start(pipeline_name="sample.sleep", inputs={})

    async def watch() -> list[Any]:
        app = WithUser(URLRouter(websocket_urlpatterns), user)
        one = WebsocketCommunicator(app, f"/ws/runs/{run.pk}/")
        every = WebsocketCommunicator(app, "/ws/runs/")
        assert (await one.connect())[0]
        assert (await every.connect())[0]
        await sync_to_async(services.run_cancel)(run=run)
        messages = [await c.receive_json_from(timeout=5) for c in (one, every)]
        for communicator in (one, every):
            await communicator.disconnect()
        return messages

    expected = {"event": "run.changed", "id": str(run.pk), "status": "cancelled"}
    assert async_to_sync(watch)() == [expected, expected]


def test_watch_stream_requires_authentication() -> None:
    async def connect() -> tuple[bool, Any]:
        app = WithUser(URLRouter(websocket_urlpatterns), AnonymousUser())
        result: tuple[bool, Any] = await WebsocketCommunicator(app, "/ws/runs/").connect()
        return result

    assert async_to_sync(connect)() == (False, 4401)


def test_a_run_past_its_deadline_times_out_and_cleans_up(drive: Driver) -> None:
    run = services.run_start(pipeline_name="sample.deadline", inputs={})
    assert run.deadline_at is not None
    drive.run_until(lambda: Run.objects.get(pk=run.pk).status == RunStatus.SUSPENDED, what="the run to sleep")
    wait_for(lambda: timezone.now() > run.deadline_at, timeout=10, what="the deadline")  # type: ignore[operator]
    assert services.runs_recover()["timed_out"] == 1
    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.TIMED_OUT
    assert "deadline" in run.error
    held = Record.objects.get(created_by_run_id=run.record_id, name="held")
    drive.run_until(lambda: Record.objects.get(pk=held.pk).phase == Phase.DELETED, what="the held record to go")
