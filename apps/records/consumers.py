"""Live hints for record watchers: authenticate, join the group, relay. Clients re-fetch over REST."""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer


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
