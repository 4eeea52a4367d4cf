"""Live hints for record watchers: authenticate, join the group, relay. Clients re-fetch over REST."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from apps.core.errors import NotFound, ValidationFailed


class RecordsConsumer(AsyncJsonWebsocketConsumer):
    group = "records"

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(self.group, self.channel_name)

    async def graphene_notify(self, message: dict[str, Any]) -> None:
        await self.send_json({k: v for k, v in message.items() if k != "type"})


def log_output(rows: Any) -> list[dict[str, Any]]:
    from apps.records.api.views import log_output as shape

    return shape(rows)


class RecordLogsConsumer(AsyncJsonWebsocketConsumer):
    """``ws/records/<id>/logs/``: a record's log, live. Query parameters as the REST logs view
    (``grep``, ``severity``, ``since``, ``until``, ``descendants``) plus ``after`` (a line id) or
    ``tail`` (start with the last N). Sends ``{"lines": [...]}`` (the REST shape) as lines are
    stored, found by id through the (record, id) index four times a second. Closes with 4401
    (not authenticated), 4404 (no such record) or 4400 (a bad parameter, after an
    ``{"error": ..., "fields": ...}`` message)."""

    poll_seconds = 0.25

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        await self.accept()
        params = {k: v[-1] for k, v in parse_qs(self.scope.get("query_string", b"").decode()).items()}
        try:
            self.rows, after = await sync_to_async(_log_query)(
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
        def fetch(after: int) -> list[dict[str, Any]]:
            return list(self.rows.filter(id__gt=after).order_by("id")[:1000])

        while True:
            batch = await sync_to_async(fetch)(after)
            if batch:
                after = batch[-1]["id"]
                await self.send_json({"lines": log_output(batch)})
                if len(batch) == 1000:
                    continue
            await asyncio.sleep(self.poll_seconds)


def _log_query(user: Any, record_id: str, params: dict[str, str]) -> tuple[Any, int]:
    from apps.observability.selectors import log_lines
    from apps.records.api.views import LOG_FIELDS
    from apps.records.selectors import record_get

    record = record_get(user=user, record_id=record_id)
    rows = log_lines(
        record=record,
        include_descendants=params.get("descendants", "true").lower() not in {"0", "false", "no"},
        grep=params.get("grep"),
        min_severity=params.get("severity"),
        since=_when(params, "since"),
        until=_when(params, "until"),
    ).values(*LOG_FIELDS)
    after = _number(params, "after", 0, 2**62)
    if "tail" in params:
        newest = list(rows.order_by("-id").values_list("id", flat=True)[: _number(params, "tail", 1, 10_000)])
        after = newest[-1] - 1 if newest else 0
    return rows, after


def _number(params: dict[str, str], name: str, lo: int, hi: int) -> int:
    raw = params.get(name, str(lo))
    if not raw.isdigit() or not lo <= int(raw) <= hi:
        raise ValidationFailed(f"{name}={raw!r} must be an integer from {lo} to {hi}", fields={name: ["out of range"]})
    return int(raw)


def _when(params: dict[str, str], name: str) -> Any:
    raw = params.get(name)
    if not raw:
        return None
    value = parse_datetime(raw)
    if value is None:
        raise ValidationFailed(f"{name}={raw!r} is not an ISO 8601 date-time", fields={name: ["not a date-time"]})
    return value if timezone.is_aware(value) else timezone.make_aware(value, dt.UTC)
