"""Pipelines of the SSH install tests. Workers load them through ``GRAPHENE_PIPELINE_MODULES``
(the tests start them with it); importing the module registers them in the test process."""

from __future__ import annotations

from graphene_sdk import Context, pipeline
from pydantic import BaseModel


class SSHInputs(BaseModel):
    host: str = "127.0.0.1"
    port: int
    user: str
    key: str  # the secret's name
    host_key: str


class SSHOutput(BaseModel):
    exit_code: int
    home: str


@pipeline("agents.ssh", inputs=SSHInputs)
def over_ssh(ctx: Context, inputs: SSHInputs) -> SSHOutput:
    """Installs an agent over SSH, names the key in a spec and a log line, runs two commands."""
    key = ctx.secret(inputs.key)
    box = ctx.agent_via_ssh(
        "box", host=inputs.host, port=inputs.port, user=inputs.user, key=key, host_key=inputs.host_key
    )
    ctx.declare("test.sleep", "uses-the-key", {"value": {"key": key}})
    ctx.log(f"installed with {key}")
    ok = box.exec(["true"])
    home = box.exec(["sh", "-c", 'echo "$HOME"'])
    return SSHOutput(exit_code=ok.exit_code, home=home.stdout_tail.strip())
