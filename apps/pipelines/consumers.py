"""Live run state: ``ws/runs/`` (every run) and ``ws/runs/<id>/`` (one run)."""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer


class RunsConsumer(AsyncJsonWebsocketConsumer):
    """Relays ``{event, id, status}`` hints; clients re-fetch the run over REST."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        run_id = self.scope["url_route"]["kwargs"].get("run_id")
        self.group = f"run.{run_id}" if run_id else "runs"
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def graphene_notify(self, message: dict[str, Any]) -> None:
        await self.send_json({k: v for k, v in message.items() if k != "type"})
