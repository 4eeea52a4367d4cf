"""Pipelines of the secret tests. Workers load this module through ``GRAPHENE_PIPELINE_MODULES``
(the tests start them with it); importing it registers the pipelines in the test process."""

from __future__ import annotations

from typing import Any

from graphene_sdk import Context, pipeline
from pydantic import BaseModel


class SpecInputs(BaseModel):
    secret: str


class SpecOutput(BaseModel):
    outputs: dict[str, Any]


@pipeline("secrets.spec", inputs=SpecInputs)
def secret_in_a_spec(ctx: Context, inputs: SpecInputs) -> SpecOutput:
    """Names a secret in a record's spec and a log line; returns the record's outputs."""
    password = ctx.secret(inputs.secret)
    db = ctx.declare("test.sleep", "db", {"value": {"env": [{"name": "PGPASSWORD", "value": password}]}})
    ctx.log(f"db uses {password}")
    return SpecOutput(outputs=db.ready())
