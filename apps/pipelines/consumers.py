"""Live run state: ``ws/runs/`` (every run the user may watch) and ``ws/runs/<id>/`` (one run)."""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.core import access
from apps.core.db import on_db_thread
from apps.core.errors import NotFound
from apps.pipelines.selectors import run_get


def _runs_group(namespace: str | None) -> str:
    return "runs" if namespace is None else f"runs.{namespace}"


def _groups(user: Any, run_id: Any) -> list[str] | None:
    """The groups to join; ``None`` when the run is not one the user may see."""
    if run_id is not None:
        try:
            run = run_get(user=user, run_id=run_id)
        except NotFound:
            return None
        return [f"run.{run.pk}"] if access.may(user, "watch", "runs", run.namespace) else []
    namespaces = access.visible_namespaces(user, "watch", "runs")
    if namespaces is None:
        return [_runs_group(None)]
    return [_runs_group(ns) for ns in sorted(namespaces)]


class RunsConsumer(AsyncJsonWebsocketConsumer):
    """Relays ``{event, id, status}`` hints; clients re-fetch the run over REST. Closes with 4401
    without credentials, 4404 for a run the user may not see, 4403 when nothing may be watched."""

    groups_joined: list[str]
    access_rule = ("watch", "runs")  # read by tests/access: every route names its rule

    async def connect(self) -> None:
        self.groups_joined = []
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        groups = await on_db_thread(_groups)(user, self.scope["url_route"]["kwargs"].get("run_id"))
        if groups is None:
            await self.close(code=4404)
            return
        if not groups:
            await self.close(code=4403)
            return
        self.groups_joined = groups
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def graphene_notify(self, message: dict[str, Any]) -> None:
        await self.send_json({k: v for k, v in message.items() if k != "type"})
