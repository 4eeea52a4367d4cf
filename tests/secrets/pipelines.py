"""Pipelines of the secret tests. Workers load this module through ``GRAPHENE_PIPELINE_MODULES``
(the tests start them with it); importing it registers the pipelines in the test process."""

from __future__ import annotations

import os
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


class CarelessInputs(BaseModel):
    token: str  # a secret's name
    key: str  # another's, a multi-line value
    env_path: str  # where the agent's install config is handed over


def _write_private(path: str, text: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return path


@pipeline("secrets.careless", inputs=CarelessInputs)
def careless(ctx: Context, inputs: CarelessInputs) -> None:
    """Uses two secrets every way a pipeline could let a value out, then fails saying why."""
    token, key = ctx.secret(inputs.token), ctx.secret(inputs.key)
    box = ctx.agent("box", labels={"role": "deploy"})
    ctx.step("install", _write_private, inputs.env_path, box.install_env())
    ctx.log(f"deploying with {token} and {key}")
    db = ctx.declare("test.sleep", "db", {"value": {"password": token, "key": key}})
    db.ready()
    # The programs print the values they were given: on stdout, on stderr, in their results.
    shown = box.exec(
        ["sh", "-c", 'echo "token=$TOKEN"; echo "$KEY"; echo "again: $TOKEN" >&2'],
        env={"TOKEN": token, "KEY": key, "PLAIN": "visible"},
    )
    ctx.log(f"the command said {shown.stdout_tail!r} and {shown.stderr_tail!r}")
    failed = box.exec(["sh", "-c", 'echo "cannot log in as deploy:$TOKEN" >&2; exit 7'], env={"TOKEN": token})
    if failed.exit_code:
        raise RuntimeError(f"login failed ({failed.exit_code}): {failed.stderr_tail.strip()}")
