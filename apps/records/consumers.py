"""Live hints for record watchers: authenticate, join the group, relay. Clients re-fetch over REST."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.api.params import log_filter_params, log_start_params
from apps.core import access, validation
from apps.core.db import on_db_thread
from apps.core.errors import NotFound, ValidationFailed
from apps.observability.selectors import log_batches, log_rows, log_start
from apps.records.selectors import record_get
from apps.records.services import records_group


def _watch_groups(user: Any, resource: str, group_of: Any) -> list[str]:
    """The groups a watcher of ``resource`` joins: all namespaces' or each allowed one's."""
    namespaces = access.visible_namespaces(user, "watch", resource)
    if namespaces is None:
        return [group_of(None)]
    return [group_of(ns) for ns in sorted(namespaces)]


class RecordsConsumer(AsyncJsonWebsocketConsumer):
    """``ws/records/``: ``records.changed`` hints for the records the user may watch: the group
    of every namespace's hints, or one group per namespace the access module allows. 4401 without
    credentials, 4403 with none allowed."""

    groups_joined: list[str]
    access_rule = ("watch", "records")  # read by tests/access: every route names its rule

    async def connect(self) -> None:
        self.groups_joined = []
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.groups_joined = await on_db_thread(_watch_groups)(user, "records", records_group)
        if not self.groups_joined:
            await self.close(code=4403)
            return
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def graphene_notify(self, message: dict[str, Any]) -> None:
        await self.send_json({k: v for k, v in message.items() if k != "type"})


class RecordLogsConsumer(AsyncJsonWebsocketConsumer):
    """``ws/records/<id>/logs/``: a record's log, live. Query parameters as the REST logs view
    (``grep``, ``severity``, ``since``, ``until``, ``descendants``) plus ``after`` (a line id) or
    ``tail`` (start with the last N). Sends ``{"lines": [...]}`` (the REST shape) as lines are
    stored, found by id through the (record, id) index four times a second. Closes with 4401
    (not authenticated), 4404 (no such record) or 4400 (a bad parameter, after an
    ``{"error": ..., "fields": ...}`` message)."""

    access_rule = ("watch", "records")

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        await self.accept()
        parsed = parse_qs(self.scope.get("query_string", b"").decode(errors="replace"))
        params = {k: v[-1] for k, v in parsed.items()}
        try:
            validation.check_params(parsed)  # the REST door's check: storable text only
            # on_db_thread: closes the connection after (the web's pool gets it back).
            self.rows, after = await on_db_thread(_log_query)(
                user, str(self.scope["url_route"]["kwargs"]["record_id"]), params
            )
        except NotFound as exc:
            await self.send_json({"error": exc.detail})
            await self.close(code=4404)
            return
        except ValidationFailed as exc:
            await self.send_json({"error": exc.detail, "fields": exc.fields})
            await self.close(code=4400)
            return
        self.follower = asyncio.ensure_future(self._follow(after))

    async def disconnect(self, code: int) -> None:
        follower = getattr(self, "follower", None)
        if follower is not None:
            follower.cancel()

    async def _follow(self, after: int) -> None:
        async for batch in log_batches(self.rows, after, on_thread=on_db_thread):
            if batch:
                await self.send_json({"lines": batch.lines()})


def _log_query(user: Any, record_id: str, params: dict[str, str]) -> tuple[Any, int]:
    record = record_get(user=user, record_id=record_id)
    if not access.may(user, "watch", "records", record.namespace):
        raise NotFound(f"no record {record_id}")
    rows, _covered = log_rows(record=record, **log_filter_params(params))
    return rows, log_start(rows, **log_start_params(params))
