"""A release: retries for the flaky parts, at-most-once for the one that must not repeat.

``publish`` is at most once: if the worker dies while it runs, the run does not publish a
second time — it gets ``OutcomeUnknown`` and decides (here: it asks for a human).
"""

from __future__ import annotations

import random

from graphene_sdk import Context, OutcomeUnknown, pipeline
from pydantic import BaseModel, Field


class ReleaseInputs(BaseModel):
    version: str = Field(pattern=r"^\d+\.\d+\.\d+$", description="semantic version to release")
    flaky_build: bool = Field(default=True, description="make the build fail now and then")


class ReleaseResult(BaseModel):
    version: str
    artifact: str
    published: bool
    note: str


def build(version: str, flaky: bool) -> str:
    if flaky and random.random() < 0.5:  # noqa: S311 - a simulated flaky build
        raise RuntimeError("the build agent lost its cache")
    return f"app-{version}.tar.gz"


def publish(artifact: str) -> str:
    return f"published {artifact}"


@pipeline("release", inputs=ReleaseInputs)
def release(ctx: Context, inputs: ReleaseInputs) -> ReleaseResult:
    """Builds with retries, stages the artifact as a record, publishes at most once."""
    artifact = ctx.step("build", build, inputs.version, inputs.flaky_build, retries=5)
    staging = ctx.declare("test.flaky", "staging-slot", {"create_failures": 1})
    _, error = staging.try_ready()
    if error is not None:
        return ReleaseResult(version=inputs.version, artifact=artifact, published=False, note=f"no staging: {error}")
    try:
        note = ctx.step("publish", publish, artifact, guarantee="at_most_once")
        published = True
    except OutcomeUnknown:
        note, published = "publish was interrupted; check the registry before publishing again", False
    ctx.log(note)
    return ReleaseResult(version=inputs.version, artifact=artifact, published=published, note=note)
