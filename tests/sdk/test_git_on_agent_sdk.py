"""``graphene_sdk.libs.git.checkout(..., on=agent)`` in the testing kit, and its argument checks."""

from __future__ import annotations

from graphene_sdk import Context, pipeline
from graphene_sdk.libs import git
from graphene_sdk.testing import World
from pydantic import BaseModel

REPOSITORY = "https://git.example.com/org/app.git"


class Empty(BaseModel):
    pass


@pipeline("git.on-agent", inputs=Empty)
def on_agent(ctx: Context, inputs: Empty) -> None:
    box = ctx.agent("box")
    git.checkout(ctx, "src", repository=REPOSITORY, ref="main", path="/srv/build/src", on=box)
    git.checkout(ctx, "server", repository=REPOSITORY)


def test_a_checkout_on_a_declared_agent_is_owned_by_it() -> None:
    world = World()
    result = world.run(on_agent, Empty())
    assert result.status == "succeeded", result.error
    box = world.record("box", kind="agent", include_deleted=True)
    src = world.record("src", kind="git.checkout", include_deleted=True)
    assert src.spec["agent"] == box.id
    assert src.spec["path"] == "/srv/build/src"
    assert src.owner == f"record:{box.id}", "removed before the agent goes"
    server = world.record("server", kind="git.checkout", include_deleted=True)
    assert "agent" not in server.spec
    assert server.owner.startswith("run:")


@pipeline("git.relative", inputs=Empty)
def relative(ctx: Context, inputs: Empty) -> None:
    git.checkout(ctx, "src", repository=REPOSITORY, path="build/src", on=ctx.agent("box"))


@pipeline("git.no-path", inputs=Empty)
def no_path(ctx: Context, inputs: Empty) -> None:
    git.checkout(ctx, "src", repository=REPOSITORY, on=ctx.agent("box"))


def test_a_checkout_on_a_machine_needs_an_absolute_path() -> None:
    for program in (relative, no_path):
        result = World().run(program, Empty())
        assert result.status == "failed"
        assert "absolute path" in result.error_text


def test_on_is_the_server_or_an_agent_handle() -> None:
    @pipeline("git.bad-on", inputs=Empty)
    def bad(ctx: Context, inputs: Empty) -> None:
        git.checkout(ctx, "src", repository=REPOSITORY, path="/srv/x", on="box")  # type: ignore[arg-type]

    result = World().run(bad, Empty())
    assert result.status == "failed"
    assert "agent handle" in result.error_text
