"""Pipelines (and one bare Celery task) for the run benchmarks.

Loaded through ``GRAPHENE_PIPELINE_MODULES=bench._runs_pipelines`` (and ``CELERY_IMPORTS`` in
``bench._runs_settings``, so the workers know ``bench.celery_stamp`` from the start).

Timestamps are taken *inside* the step function (wall clock, ``time.time()``; benchmark and
workers run on the same machine) and handed back as the step's journaled result and, where
the benchmark waits for them, pushed onto a Redis list (``RPUSH``) that the benchmark pops
with ``BLPOP``: no polling on either side.
"""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task
from django.conf import settings
from graphene_sdk import Context, pipeline
from pydantic import BaseModel, Field

_redis: Any = None


def _push(key: str, value: float) -> None:
    global _redis
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    _redis.rpush(key, repr(value))


def _noop() -> None:
    return None


def _stamp() -> float:
    return time.time()


def _stamp_push(key: str) -> float:
    now = time.time()
    _push(key, now)
    return now


class StepsInputs(BaseModel):
    steps: int = Field(default=200, ge=2, le=100_000)


@pipeline("bench.steps", inputs=StepsInputs)
def steps(ctx: Context, inputs: StepsInputs) -> None:
    """``steps`` checkpointed steps: the first and the last return the wall-clock time at which
    they executed, the ones between are no-ops. (The step-overhead benchmark.)"""
    ctx.step("first", _stamp)
    for i in range(inputs.steps - 2):
        ctx.step(f"noop-{i}", _noop)
    ctx.step("last", _stamp)


class FirstInputs(BaseModel):
    key: str


@pipeline("bench.first", inputs=FirstInputs)
def first(ctx: Context, inputs: FirstInputs) -> None:
    """One step that reports when it executed. (The start-to-first-step latency benchmark.)"""
    ctx.step("first", _stamp_push, inputs.key)


class WaitInputs(BaseModel):
    create_ms: int = Field(default=0, ge=0)


@pipeline("bench.wait", inputs=WaitInputs)
def wait(ctx: Context, inputs: WaitInputs) -> None:
    """Declare one record, wait for it (the run suspends while it is not ready), then one step.
    (The suspended-runs benchmark.)"""
    gate = ctx.declare("test.sleep", "gate", {"create_ms": inputs.create_ms})
    gate.ready()
    ctx.step("after", _noop)


@shared_task(name="bench.celery_stamp", ignore_result=True)
def celery_stamp(key: str) -> None:
    """The bare Celery baseline: a task whose body only reports when it executed."""
    _push(key, time.time())


def _gated_step(key: str, gate: str) -> float:
    """Report that the step began, then wait while the gate is closed (``kinds.testing.gate_wait``)."""
    from kinds.testing import gate_wait

    _push(key, time.time())
    gate_wait(gate)
    return time.time()


class GatedInputs(BaseModel):
    key: str
    gate: str


@pipeline("bench.gated", inputs=GatedInputs)
def gated(ctx: Context, inputs: GatedInputs) -> None:
    """One step that reports when it began and waits while a gate file exists. (The crash
    recovery benchmark holds steps in flight with it, kills their worker, opens the gate.)"""
    ctx.step("gated", _gated_step, inputs.key, inputs.gate)
