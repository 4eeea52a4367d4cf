"""Client notifications: ``{type, id, version}`` hints sent to Channels groups after commit.

Clients treat them as hints and re-fetch over REST, so a lost message costs a refresh, never
correctness.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from django.db import transaction

logger = logging.getLogger(__name__)


def publish_on_commit(group: str, payload: dict[str, Any]) -> None:
    """Send ``payload`` to ``group`` once the surrounding transaction commits."""

    def send() -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(group, {"type": "graphene.notify", **payload})
        except Exception:  # a notification is a hint; never fail the write that caused it
            logger.warning("could not publish %s to %s", payload.get("type"), group, exc_info=True)

    transaction.on_commit(send)
