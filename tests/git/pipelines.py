"""Pipelines of the git tests. Workers load this module through ``GRAPHENE_PIPELINE_MODULES``
(the tests start them with it); importing it registers the pipelines in the test process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graphene_sdk import Context, pipeline
from graphene_sdk.libs import git
from pydantic import BaseModel


class ReleaseInputs(BaseModel):
    repository: str
    ref: str = "main"
    secret: str | None = None
    username: str | None = None
    version: str = "9"


class ReleaseOutput(BaseModel):
    readme: str
    checkout: dict[str, Any]
    heads: list[str]
    commit: dict[str, Any]
    tag: dict[str, Any]


def read(path: str, name: str) -> str:
    return (Path(path) / name).read_text()


def write(path: str, name: str, content: str) -> None:
    (Path(path) / name).write_text(content)


@pipeline("git.release", inputs=ReleaseInputs)
def release(ctx: Context, inputs: ReleaseInputs) -> ReleaseOutput:
    """Check out a branch, read a file, list the remote, commit a version file, tag it, push."""
    auth = ctx.secret(inputs.secret) if inputs.secret else None
    src = git.checkout(
        ctx, "src", repository=inputs.repository, ref=inputs.ref, auth=auth, username=inputs.username, on_drift="report"
    )
    checkout = src.ready()
    path = checkout["path"]
    readme = ctx.step("read README", read, path, "README")
    refs = git.ls_remote(ctx, inputs.repository, auth=auth, username=inputs.username)
    ctx.step("write VERSION", write, path, "VERSION", inputs.version + "\n")
    committed = git.commit(
        ctx, path, f"version {inputs.version}", paths=["VERSION"], auth=auth, username=inputs.username
    )
    tagged = git.tag(ctx, path, f"v{inputs.version}", message="release", auth=auth, username=inputs.username)
    ctx.log(f"released v{inputs.version} at {committed['commit']} with {auth}")
    return ReleaseOutput(
        readme=readme,
        checkout=checkout,
        heads=sorted(r for r in refs if r.startswith("refs/heads/")),
        commit=committed,
        tag=tagged,
    )
