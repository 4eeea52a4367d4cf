"""``need``, ``ctx.attach_agent``, ``ctx.select_agents`` and ``ctx.publish_capability`` in the
testing kit, and the SDK's checks of their arguments."""

from __future__ import annotations

from typing import Any

import pytest
from graphene_sdk import AttachedAgent, Context, need, pipeline
from graphene_sdk.libs.file import file
from graphene_sdk.testing import World
from pydantic import BaseModel


class Empty(BaseModel):
    pass


class Found(BaseModel):
    attached: str
    selected: list[str]
    docker_hosts: list[str]


@pipeline("caps.kit", inputs=Empty)
def kit(ctx: Context, inputs: Empty) -> Found:
    builder = ctx.attach_agent("builder", needs=[need("docker", where_label={"arch": "amd64"})])
    ctx.publish_capability(builder, "cache", version="2")
    selected = ctx.select_agents(labels={"pool": "ci"}, needs=[need("cache", where_in={"version": ["1", "2"]})])
    docker = ctx.select_agents(needs=[need("docker")])
    file(ctx, "conf", path="/etc/app.conf", content="x", on=builder).ready()
    return Found(attached=builder.name, selected=[a.name for a in selected], docker_hosts=[a.name for a in docker])


@pipeline("caps.unmet", inputs=Empty)
def unmet(ctx: Context, inputs: Empty) -> None:
    ctx.attach_agent("arm", needs=[need("docker", where_label={"arch": "amd64"})])


def test_attach_select_and_publish_in_the_world() -> None:
    world = World()
    builder = world.add_agent("builder", labels={"pool": "ci"}, capabilities={"docker": ("24", {"arch": "amd64"})})
    world.add_agent("arm", labels={"pool": "ci"}, capabilities={"docker": ("24", {"arch": "arm64"})})
    result = world.run(kit, Empty())
    assert result.status == "succeeded", result.error
    assert result.output == Found(attached="builder", selected=["builder"], docker_hosts=["arm", "builder"])
    assert world.capabilities[builder.id]["cache"] == ("2", {})
    world.assert_no_leaks()
    assert builder.alive  # attached, not owned: the run's end leaves it


def test_unmet_needs_fail_the_run() -> None:
    world = World()
    world.add_agent("arm", capabilities={"docker": ("24", {"arch": "arm64"})})
    result = world.run(unmet, Empty())
    assert result.status == "failed"
    assert "does not meet the needs" in result.error_text


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": ""}, ValueError),
        ({"name": "docker", "where_label": {"arch": 64}}, TypeError),
        ({"name": "docker", "where_in": {"version": "24"}}, TypeError),
        ({"name": "docker", "where_in": {"version": []}}, ValueError),
    ],
)
def test_bad_needs_are_refused_in_the_sdk(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        need(**kwargs)


def test_an_attached_agent_runs_commands_but_cannot_be_deleted_or_owned() -> None:
    assert hasattr(AttachedAgent, "exec")
    assert hasattr(AttachedAgent, "put_file")
    assert hasattr(AttachedAgent, "run")
    assert not hasattr(AttachedAgent, "delete")
    assert not hasattr(AttachedAgent, "install_env")
    assert need("docker", where_in={"version": ("24",)}).to_json() == {
        "name": "docker",
        "where_label": {},
        "where_in": {"version": ["24"]},
    }


class NeedsInputs(BaseModel):
    publish: bool


@pipeline("caps.declared", inputs=NeedsInputs)
def declared(ctx: Context, inputs: NeedsInputs) -> None:
    box = ctx.agent("trainer", needs=[need("gpu", where_label={"vendor": "nvidia"})])
    if inputs.publish:
        ctx.publish_capability(box, "gpu", labels={"vendor": "nvidia"})
    box.ready()


def test_a_declared_agent_is_ready_only_once_its_needs_are_published() -> None:
    world = World()
    assert world.run(declared, NeedsInputs(publish=True)).status == "succeeded"
    failed = world.run(declared, NeedsInputs(publish=False))
    assert failed.status == "failed"
    assert "does not publish ['gpu (it publishes nothing)']" in failed.error_text
