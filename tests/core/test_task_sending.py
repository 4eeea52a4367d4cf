"""Sending tasks (graphene_project/celery.py): a plain send to a Redis broker is pushed straight
onto the queue's list, and it must be the very message Celery's own ``apply_async`` sends, so
that a worker cannot tell them apart; any other send still goes through ``apply_async``; a
broker that cannot be reached is an ``OperationalError``, as with ``apply_async``."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import celery
import pytest
import redis
from celery import Celery
from django.conf import settings
from kombu.exceptions import OperationalError

from graphene_project.celery import Task, _direct


@pytest.fixture
def probe_app() -> Iterator[tuple[Celery, Any, redis.Redis]]:
    """An app configured as Graphene's, on a queue of its own (the shared workers' queue is
    left alone), with one task; its messages are removed afterwards."""
    app: Celery = Celery("graphene-send-probe", task_cls=Task, set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    queue = f"graphene-send-probe-{uuid.uuid4().hex[:8]}"
    app.conf.task_default_queue = queue

    @app.task(name="tests.send_probe", ignore_result=True)
    def probe(record_id: str) -> None:  # never executed: no worker reads this queue
        raise AssertionError(record_id)

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        yield app, probe, client
    finally:
        client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        client.close()


def _pushed(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """The queue's messages, oldest first (kombu pushes on the left, workers pop on the right)."""
    return [json.loads(raw) for raw in reversed(client.lrange(queue, 0, -1))]


def _without_identity(message: dict[str, Any]) -> dict[str, Any]:
    """What two sends of the same call share: all but the ids and the clock."""
    headers = {k: v for k, v in message["headers"].items() if k not in {"id", "root_id", "eta"}}
    properties = {k: v for k, v in message["properties"].items() if k not in {"correlation_id", "delivery_tag"}}
    return {**message, "headers": headers, "properties": properties}


@pytest.mark.parametrize("countdown", [0, 30])
def test_a_direct_send_is_the_message_apply_async_sends(
    probe_app: tuple[Celery, Any, redis.Redis], countdown: float
) -> None:
    app, probe, client = probe_app
    queue = app.conf.task_default_queue
    record_id = str(uuid.uuid4())

    assert _direct(app) is not None, "Graphene's settings make plain sends direct"
    direct = probe.apply_async((record_id,), countdown=countdown)
    assert not client.exists(f"_kombu.binding.{queue}"), "sent directly: kombu declared no queue"
    before = datetime.now().astimezone()
    stock = celery.Task.apply_async(probe, (record_id,), countdown=countdown)
    mine, theirs = _pushed(client, queue)

    assert mine["headers"]["id"] == direct.id
    assert theirs["headers"]["id"] == stock.id
    assert mine["headers"]["id"] == mine["headers"]["root_id"] == mine["properties"]["correlation_id"]
    assert mine["properties"]["delivery_tag"] != theirs["properties"]["delivery_tag"]
    assert _without_identity(mine) == _without_identity(theirs)
    if not countdown:
        assert mine["headers"]["eta"] is None
        assert theirs["headers"]["eta"] is None
    else:  # the same eta, give or take the moment between the two sends
        eta, their_eta = (datetime.fromisoformat(m["headers"]["eta"]) for m in (mine, theirs))
        assert abs(their_eta - eta) < timedelta(seconds=5)
        assert abs(eta - (before + timedelta(seconds=countdown))) < timedelta(seconds=5)


@pytest.mark.parametrize(
    "tls",
    [{"broker_url": "rediss://127.0.0.1:6379/0"}, {"broker_use_ssl": {"ssl_cert_reqs": "required"}}],
    ids=["rediss-url", "broker-use-ssl"],
)
def test_a_broker_reached_over_tls_is_left_to_apply_async(tls: dict[str, Any]) -> None:
    """The direct sender's client speaks plain Redis: a broker behind TLS is kombu's to reach."""
    app: Celery = Celery("graphene-send-tls", task_cls=Task, set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.conf.update(tls)
    assert _direct(app) is None


def test_a_send_with_other_options_goes_through_apply_async(probe_app: tuple[Celery, Any, redis.Redis]) -> None:
    """``expires`` is one option the direct path does not make: the message still carries it."""
    app, probe, client = probe_app
    probe.apply_async((str(uuid.uuid4()),), expires=60)
    (message,) = _pushed(client, app.conf.task_default_queue)
    expires = datetime.fromisoformat(message["headers"]["expires"])
    assert timedelta(seconds=30) < expires - datetime.now().astimezone() <= timedelta(seconds=60)


def test_a_task_with_options_of_its_own_is_sent_through_apply_async(
    probe_app: tuple[Celery, Any, redis.Redis],
) -> None:
    """A time limit set on the task is one the direct path does not make: the message carries it."""
    app, _probe, client = probe_app

    @app.task(name="tests.send_limited", time_limit=30)
    def limited(record_id: str) -> None:
        raise AssertionError(record_id)

    limited.apply_async((str(uuid.uuid4()),))
    (message,) = _pushed(client, app.conf.task_default_queue)
    assert message["headers"]["timelimit"] == [30, None]


def test_arguments_the_task_cannot_take_are_refused_before_anything_is_sent(
    probe_app: tuple[Celery, Any, redis.Redis],
) -> None:
    app, probe, client = probe_app
    with pytest.raises(TypeError, match="argument"):
        probe.apply_async(("one", "two"))
    assert _pushed(client, app.conf.task_default_queue) == []


def test_a_send_to_a_broker_that_cannot_be_reached_is_an_operational_error() -> None:
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    app: Celery = Celery("graphene-send-nowhere", task_cls=Task, set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.conf.update(
        broker_url=f"redis://127.0.0.1:{port}/0", task_publish_retry_policy={"max_retries": 1, "interval_step": 0.05}
    )

    @app.task(name="tests.send_nowhere")
    def nowhere(record_id: str) -> None:
        raise AssertionError(record_id)

    started = time.monotonic()
    with pytest.raises(OperationalError, match=r"could not send tests\.send_nowhere to "):
        nowhere.apply_async(("x",))
    assert time.monotonic() - started < 5, "one retry 0.05 s later, then the error"
