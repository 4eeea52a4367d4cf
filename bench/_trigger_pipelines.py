"""Pipelines with triggers, for ``bench/trigger_latency.py`` only.

Loaded through ``GRAPHENE_PIPELINE_MODULES=bench._trigger_pipelines`` by that benchmark alone:
a trigger exists once its pipeline's row is synced, and an every-second cron trigger in a
module the other run benchmarks load would start runs in them too.

* ``bench.up`` → ``bench.down``: an ``upstream`` trigger whose ``inputs`` callable hands the
  upstream run's ``key`` on (the callable is part of the path measured).
* ``bench.cron``: a ``cron`` trigger on every second (six fields, seconds last).

Each pipeline is one no-op step: the benchmark measures starts, not work.
"""

from __future__ import annotations

from typing import Any

from graphene_sdk import Context, UpstreamRun, cron, pipeline, upstream
from pydantic import BaseModel

UPSTREAM = "bench.up"
DOWNSTREAM = "bench.down"
CRON = "bench.cron"
CRON_TRIGGER = "every-second"


def _noop() -> None:
    return None


class KeyInputs(BaseModel):
    key: str


class NoInputs(BaseModel):
    pass


def _down_inputs(up: UpstreamRun) -> dict[str, Any]:
    return {"key": up.inputs["key"]}


@pipeline(UPSTREAM, inputs=KeyInputs)
def up(ctx: Context, inputs: KeyInputs) -> None:
    """The upstream: its success starts ``bench.down``."""
    ctx.step("first", _noop)


@pipeline(DOWNSTREAM, inputs=KeyInputs, triggers=[upstream(UPSTREAM, inputs=_down_inputs)])
def down(ctx: Context, inputs: KeyInputs) -> None:
    """Started by each successful ``bench.up`` run (and manually, for the baseline)."""
    ctx.step("first", _noop)


@pipeline(CRON, inputs=NoInputs, triggers=[cron("* * * * * *", name=CRON_TRIGGER)])
def every_second(ctx: Context, inputs: NoInputs) -> None:
    """Started at every second's instant while its trigger exists and is not paused."""
    ctx.step("first", _noop)
