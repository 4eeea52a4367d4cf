"""Client notifications: ``{type, id, version}`` hints sent to Channels groups after commit.

Clients treat them as hints and re-fetch over REST, so a lost message costs a refresh, never
correctness.

With a network channel layer (Redis) hints are handed to one event-loop thread per process
and sent from there: ``async_to_sync`` would build a fresh event loop for every call, and
channels_redis keeps its connections per loop, so every hint paid for a new Redis connection
(4-8 ms measured here) on the committing thread. The in-memory layer (tests, embedded mode)
keeps ``async_to_sync``: its queues belong to the loop of the server that reads them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

from asgiref.sync import async_to_sync
from django.db import transaction

logger = logging.getLogger(__name__)

_Message = tuple[str, dict[str, Any]]

# How long lazy hints wait and gather (``publish_many_on_commit``): below what a person notices.
LAZY_SECONDS = 0.05


class _Sender:
    """One event loop per process, in a daemon thread (re-created after a fork), sending the
    hints one after the other over the layer's kept connections. A backlog beyond ``limit``
    (the layer is down or slow) is dropped: hints are not worth blocking a worker for."""

    limit = 10_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[Any, list[_Message]]] | None = None
        self._pid = 0
        self._drainer: asyncio.Task[None] | None = None
        # Lazy hints waiting (loop thread only): the latest one per layer, group and subject.
        self._held: dict[tuple[Any, ...], tuple[Any, str, dict[str, Any]]] = {}

    def _start(self) -> asyncio.AbstractEventLoop:
        if self._loop is None or self._pid != os.getpid():
            with self._lock:
                if self._loop is None or self._pid != os.getpid():
                    loop = asyncio.new_event_loop()
                    self._queue = asyncio.Queue()
                    self._drainer = loop.create_task(self._drain())
                    threading.Thread(target=loop.run_forever, name="graphene-publish", daemon=True).start()
                    self._loop, self._pid = loop, os.getpid()
        return self._loop

    async def _drain(self) -> None:
        assert self._queue is not None
        while True:
            layer, messages = await self._queue.get()
            await _send_all(layer, messages)

    def _put(self, item: tuple[Any, list[_Message]]) -> None:
        assert self._queue is not None
        if self._queue.qsize() < self.limit:
            self._queue.put_nowait(item)
        else:
            logger.warning("dropping %d notifications: the channel layer is not keeping up", len(item[1]))

    def send(self, layer: Any, messages: list[_Message]) -> None:
        self._start().call_soon_threadsafe(self._put, (layer, messages))

    def send_lazily(self, layer: Any, messages: list[_Message]) -> None:
        self._start().call_soon_threadsafe(self._hold, layer, messages)

    def _hold(self, layer: Any, messages: list[_Message]) -> None:
        if not self._held:
            asyncio.get_running_loop().call_later(LAZY_SECONDS, self._release)
        for group, message in messages:
            # A later hint about the same subject to the same group replaces the one held.
            self._held[(id(layer), group, message.get("event"), message.get("id"))] = (layer, group, message)

    def _release(self) -> None:
        held, self._held = self._held, {}
        batches: dict[int, tuple[Any, list[_Message]]] = {}
        for layer, group, message in held.values():
            batches.setdefault(id(layer), (layer, []))[1].append((group, message))
        for batch in batches.values():
            self._put(batch)


_sender = _Sender()


async def _send_all(layer: Any, messages: list[_Message]) -> None:
    for group, message in messages:
        try:
            await layer.group_send(group, message)
        except Exception:  # a notification is a hint; never fail the write that caused it
            logger.warning("could not publish %s to %s", message.get("event"), group, exc_info=True)


def _flush(messages: list[_Message], *, lazy: bool = False) -> None:
    from channels.layers import InMemoryChannelLayer, get_channel_layer

    layer = get_channel_layer()
    if layer is None or not messages:
        return
    try:
        if isinstance(layer, InMemoryChannelLayer):
            # Its groups live in this process: hints for a group nobody here joined reach no
            # one, and ``async_to_sync`` would start a thread to deliver them to no one (a
            # Celery worker's every commit, with the in-memory layer of tests and benchmarks).
            messages = [(group, message) for group, message in messages if layer.groups.get(group)]
            if messages:
                async_to_sync(_send_all)(layer, messages)
        elif lazy:
            _sender.send_lazily(layer, messages)
        else:
            _sender.send(layer, messages)
    except Exception:
        logger.warning("could not publish %d notifications", len(messages), exc_info=True)


def publish_on_commit(group: str, payload: dict[str, Any]) -> None:
    """Send ``payload`` to ``group`` once the surrounding transaction commits."""
    publish_many_on_commit([(group, payload)])


def publish_many_on_commit(messages: list[tuple[str, dict[str, Any]]], *, lazy: bool = False) -> None:
    """Send each ``(group, payload)`` once the surrounding transaction commits, in one hand-over
    to the layer (the in-memory layer's ``async_to_sync`` starts a thread per hand-over).

    ``lazy``: hints for people watching, not for a process waiting on them. Through a network
    layer they leave ``LAZY_SECONDS`` later, and of several hints about one subject (``id``) to
    one group meanwhile only the latest: a run that starts and ends within that time sends one
    hint per group, and the sending no longer competes with a worker hurrying to a run's first
    step (measured: a third of a millisecond of it)."""
    batch = [(group, {"type": "graphene.notify", **payload}) for group, payload in messages]
    if batch:
        transaction.on_commit(lambda: _flush(batch, lazy=lazy))
