"""Pipelines of the capability tests: machines found by name or by what they offer."""

from __future__ import annotations

from graphene_sdk import Context, need, pipeline
from graphene_sdk.libs.file import file
from pydantic import BaseModel


class FindInputs(BaseModel):
    name: str
    folder: str


class FindOutput(BaseModel):
    hostname: str
    selected: list[str]
    unmet: list[str]
    file_digest: str


@pipeline("agents.capabilities", inputs=FindInputs)
def find(ctx: Context, inputs: FindInputs) -> FindOutput:
    """Attach a machine by name, publish what it offers, then find it by that; put a file on it."""
    box = ctx.attach_agent(inputs.name)
    version = box.run(python_version)
    ctx.publish_capability(box, "python", version=version, labels={"impl": "cpython"})
    py3 = need("python", where_label={"impl": "cpython"}, where_in={"version": [version, "2.7"]})
    again = ctx.attach_agent(inputs.name, needs=[py3])
    selected = ctx.select_agents(labels={"suite": "agents"}, needs=[py3])
    unmet = ctx.select_agents(needs=[need("python", where_in={"version": ["2.7"]})])
    note = file(ctx, "note", path=f"{inputs.folder}/note.txt", content="on an attached machine\n", on=again)
    digest = note.ready()["digest"]
    hostname = again.exec(["hostname"]).stdout_tail.strip()
    return FindOutput(
        hostname=hostname, selected=[a.name for a in selected], unmet=[a.name for a in unmet], file_digest=digest
    )


def python_version() -> str:
    """Runs on the machine: its Python's major.minor."""
    import sys

    return f"{sys.version_info[0]}.{sys.version_info[1]}"


class NeedInputs(BaseModel):
    name: str


@pipeline("agents.capabilities.unmet", inputs=NeedInputs)
def unmet_needs(ctx: Context, inputs: NeedInputs) -> None:
    """Attach with a need the machine does not meet: the run fails saying what it offers."""
    ctx.attach_agent(inputs.name, needs=[need("gpu", where_label={"vendor": "nvidia"})])
