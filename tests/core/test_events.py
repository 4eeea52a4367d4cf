"""Hints through the network channel layer (Redis), as the web and worker processes send them:
an ordinary hint leaves at once after the commit; lazy hints (runs' status, for people
watching) leave ``LAZY_SECONDS`` later, the latest per group and subject only."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import get_channel_layer
from django.db import transaction

from apps.core import events

pytestmark = pytest.mark.django_db(transaction=True)


class Listener:
    """A channel of this test in ``groups``, read from one event loop (the layer keeps its
    connections per loop)."""

    def __init__(self, groups: list[str]) -> None:
        self.loop = asyncio.new_event_loop()
        self.layer = get_channel_layer()
        self.channel = self.loop.run_until_complete(self.layer.new_channel())
        for group in groups:
            self.loop.run_until_complete(self.layer.group_add(group, self.channel))

    def receive(self, timeout: float = 10) -> tuple[float, dict[str, Any]]:
        message = self.loop.run_until_complete(asyncio.wait_for(self.layer.receive(self.channel), timeout))
        return time.monotonic(), message

    def nothing_more(self, within: float) -> bool:
        try:
            self.receive(timeout=within)
        except TimeoutError:
            return True
        return False


@pytest.fixture
def listener(redis_layer: None) -> Iterator[Any]:
    made: list[Listener] = []

    def listen(groups: list[str]) -> Listener:
        made.append(Listener(groups))
        return made[-1]

    yield listen
    for each in made:
        each.loop.close()


def test_lazy_hints_leave_later_and_only_the_latest_per_group_and_subject(listener: Any) -> None:
    group, other = f"test-lazy-{uuid.uuid4().hex[:8]}", f"test-now-{uuid.uuid4().hex[:8]}"
    hints = listener([group, other])
    sent = time.monotonic()
    for status in ("queued", "running", "succeeded"):  # three commits about one run
        with transaction.atomic():
            events.publish_many_on_commit([(group, {"event": "run.changed", "id": "r1", "status": status})], lazy=True)
    with transaction.atomic():
        events.publish_many_on_commit([(group, {"event": "run.changed", "id": "r2", "status": "queued"})], lazy=True)
    with transaction.atomic():
        events.publish_on_commit(other, {"event": "agent.commands"})

    received = [hints.receive() for _ in range(3)]
    ordinary = [m for _at, m in received if m["event"] == "agent.commands"]
    lazy = [(at, m) for at, m in received if m["event"] == "run.changed"]
    assert len(ordinary) == 1
    assert sorted((m["id"], m["status"]) for _at, m in lazy) == [("r1", "succeeded"), ("r2", "queued")]
    assert all(at - sent >= events.LAZY_SECONDS for at, _m in lazy), "lazy hints waited"
    assert hints.nothing_more(within=events.LAZY_SECONDS * 4), "the hints they replaced were never sent"
