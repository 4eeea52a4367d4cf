"""The smallest pipeline: a checkpointed step, a durable timer and the run's log.

    curl -H "Authorization: Token $TOKEN" -H 'content-type: application/json' \
         -d '{"inputs": {"name": "Ada"}}' http://127.0.0.1:8000/api/v1/pipelines/hello/runs/
"""

from __future__ import annotations

import getpass
import platform

from graphene_sdk import Context, pipeline
from pydantic import BaseModel, Field


class HelloInputs(BaseModel):
    name: str = Field(default="world", min_length=1, max_length=100, description="who to greet")
    pause_seconds: float = Field(default=1.0, ge=0, le=3600, description="a durable pause between the steps")


class Greeting(BaseModel):
    message: str
    host: str


def where() -> str:
    return f"{getpass.getuser()}@{platform.node()}"


@pipeline("hello", inputs=HelloInputs)
def hello(ctx: Context, inputs: HelloInputs) -> Greeting:
    """Greets, pauses durably (the worker is released meanwhile) and greets again."""
    host = ctx.step("where", where)
    ctx.log(f"running on {host}")
    ctx.sleep(inputs.pause_seconds)
    message = ctx.step("greet", str.format, "Hello, {}!", inputs.name)
    ctx.log(message)
    return Greeting(message=message, host=host)
