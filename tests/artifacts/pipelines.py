"""Pipelines of the artifact tests. Workers load this module through ``GRAPHENE_PIPELINE_MODULES``
(the tests start them with it); importing it registers the pipelines in the test process."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from graphene_sdk import Context, pipeline
from graphene_sdk.libs.file import file
from pydantic import BaseModel


class PublishInputs(BaseModel):
    name: str = "dist/app.txt"
    text: str = "built bytes\n"
    keep_seconds: int = 3600
    from_path: str = ""  # publish this file of the worker instead of ``text``


class Published(BaseModel):
    id: str
    sha256: str
    size: int
    read_back: str


@pipeline("artifacts.publish", inputs=PublishInputs)
def publish(ctx: Context, inputs: PublishInputs) -> Published:
    """Publishes an artifact (kept on the stand) and reads it back through the runtime."""
    data: Any = Path(inputs.from_path) if inputs.from_path else inputs.text
    ref = ctx.publish_artifact(inputs.name, data, keep_for=timedelta(seconds=inputs.keep_seconds))
    again = ctx.publish_artifact(inputs.name, data)  # the same bytes under the same name: the same artifact
    assert again.id == ref.id, (again, ref)
    ctx.log(f"published {ref.name} as {ref.id}")
    ctx.sleep(0.2)  # suspends: the run resumes by replaying the publish calls above
    return Published(id=ref.id, sha256=ref.sha256, size=ref.size, read_back=ref.read().decode(errors="replace"))


class UseInputs(BaseModel):
    name: str = "dist/app.txt"
    from_pipeline: str = "artifacts.publish"
    path: str = "use/app.txt"


class Used(BaseModel):
    id: str
    content: str
    file: dict[str, Any]
    on_disk: str  # the file as written (it is deleted with the run)


def read_text(path: str) -> str:
    return Path(path).read_text()


@pipeline("artifacts.use", inputs=UseInputs)
def use(ctx: Context, inputs: UseInputs) -> Used:
    """Attaches the newest artifact of another pipeline, reads it and writes it into a file."""
    ref = ctx.attach_artifact(inputs.name, pipeline=inputs.from_pipeline)
    written = file(ctx, "copy", path=inputs.path, content=ref)
    outputs = written.ready()
    on_disk = ctx.step("read the file", read_text, outputs["path"])
    return Used(id=ref.id, content=ref.read().decode(), file=outputs, on_disk=on_disk)
