"""graphene_sdk.testing: pipelines run in-process against an in-memory world, no database.

None of these tests requests ``db``: pytest-django refuses any database access here, which
is part of what they prove.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from graphene_sdk import (
    Attached,
    ChildRunFailed,
    Context,
    Resource,
    ResourceFailed,
    StepFailed,
    pipeline,
)
from graphene_sdk.testing import Record, World
from pydantic import BaseModel, Field, ValidationError

REPO = Path(__file__).resolve().parents[2]

# --- the documented example (docs/testing-kit.md) ---------------------------------------------


class EnvInputs(BaseModel):
    branch: str = "main"


@pipeline("kit-example", inputs=EnvInputs)
def kit_example(ctx: Context, inputs: EnvInputs) -> None:
    """A network, a database on it; the database is kept on the stand for four hours."""
    net = ctx.declare("docker.network", "net")
    db = ctx.declare("docker.container", "db", {"image": "postgres:16"}, parent=net)
    db.ready()
    ctx.to_stand(db, keep_for=timedelta(hours=4))


def test_the_documented_example_runs_in_under_a_second_without_a_database() -> None:
    began = time.perf_counter()

    world = World()
    result = world.run(kit_example, EnvInputs(branch="dev"))
    assert result.status == "succeeded", result.error_text
    world.assert_no_leaks()  # the network died with the run; the stand's db is not a leak
    db = result.record("db")
    world.assert_owner(db, "stand:kit-example")
    assert result.record("net").phase == "deleted"

    world.advance(hours=5)  # past the four hours
    assert db.phase == "deleted"
    assert world.stand("kit-example") == []

    elapsed = time.perf_counter() - began
    assert elapsed < 1.0, f"the example took {elapsed:.3f}s"


def test_the_testing_module_needs_no_server_stack() -> None:
    probe = (
        "import sys, graphene_sdk.testing\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'django', 'rest_framework', 'psycopg', "
        "'celery', 'redis', 'kombu'})\n"
        "assert not bad, bad\n"
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO / "sdk")}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_the_testing_kit_exports_are_pinned() -> None:
    import graphene_sdk.testing

    assert sorted(graphene_sdk.testing.__all__) == ["LogLine", "Phase", "Record", "RunResult", "RunStatus", "World"]


# --- ownership, run end, stands and TTLs ------------------------------------------------------


class Nothing(BaseModel):
    pass


@pipeline("kit-stack", inputs=Nothing)
def kit_stack(ctx: Context, inputs: Nothing) -> None:
    net = ctx.declare("docker.network", "net")
    ctx.declare("docker.container", "db", parent=net)
    ctx.declare("docker.container", "cache", parent=net)
    ctx.declare("docker.volume", "scratch")


def test_a_finished_run_deletes_what_it_owns_children_first() -> None:
    world = World()
    result = world.run(kit_stack)
    assert result.succeeded
    assert [r.name for r in world.deletions] == ["scratch", "cache", "db", "net"]
    assert {r.deletion_reason for r in world.deletions} == {"RunSucceeded"}
    assert world.records() == []
    assert len(result.records) == 4
    world.assert_no_leaks()


@pipeline("kit-keep-subtree", inputs=Nothing)
def kit_keep_subtree(ctx: Context, inputs: Nothing) -> None:
    net = ctx.declare("docker.network", "net")
    ctx.declare("docker.container", "db", parent=net)
    ctx.declare("docker.container", "cache", parent=net)
    ctx.declare("docker.volume", "scratch")
    ctx.to_stand(net, keep_for=timedelta(hours=2))


def test_ttl_expiry_deletes_the_stand_subtree_children_first_at_its_moment() -> None:
    world = World()
    result = world.run(kit_keep_subtree)
    assert [r.name for r in world.deletions] == ["scratch"]  # only what the run still owned
    net = result.record("net")
    world.assert_owner(net, kit_keep_subtree)  # a Pipeline names its stand
    world.assert_owner(result.record("db"), net)
    assert net.expires_at == world.now + timedelta(hours=2)
    assert world.stand("kit-keep-subtree") == [net]
    assert [r.name for r in world.subtree(net)] == ["net", "db", "cache"]

    assert world.advance(hours=1, minutes=59) == []
    gone = world.advance(minutes=2)
    assert [r.name for r in gone] == ["cache", "db", "net"]
    assert {r.deletion_reason for r in gone} == {"Expired"}
    assert result.finished_at is not None
    assert net.deleted_at == result.finished_at + timedelta(hours=2)  # at its moment, not at the end
    world.assert_no_leaks()


def test_operators_extend_release_and_delete_stand_holdings() -> None:
    world = World()
    result = world.run(kit_keep_subtree)
    net = result.record("net")
    world.extend(net, hours=3)
    world.advance(hours=4)
    assert net.alive
    world.release(net)
    world.advance(days=30)
    assert net.alive
    assert net.expires_at is None
    assert [r.name for r in world.delete(net)] == ["cache", "db", "net"]
    with pytest.raises(ValueError, match="deleted"):
        world.extend(net, hours=1)


class Flaky(BaseModel):
    fail: bool = True


@pipeline("kit-keep-on-failure", inputs=Flaky, keep_on_failure=timedelta(hours=1))
def kit_keep_on_failure(ctx: Context, inputs: Flaky) -> None:
    net = ctx.declare("docker.network", "net")
    ctx.declare("docker.container", "db", parent=net)
    if inputs.fail:
        raise RuntimeError("the tests failed")


def test_a_failed_run_with_keep_on_failure_leaves_its_environment_on_the_stand() -> None:
    world = World()
    failed = world.run(kit_keep_on_failure, {"fail": True})
    assert failed.status == "failed"
    assert isinstance(failed.error, RuntimeError)
    assert failed.error_text == "RuntimeError: the tests failed"
    net = failed.record("net")
    world.assert_owner(net, "stand:kit-keep-on-failure")
    world.assert_owner(failed.record("db"), net)
    world.assert_no_leaks()
    world.advance(hours=1)
    assert [r.name for r in world.deletions] == ["db", "net"]

    succeeded = world.run(kit_keep_on_failure, {"fail": False})
    assert succeeded.succeeded
    assert all(not r.alive for r in succeeded.records)  # success keeps nothing


# --- kinds: outputs, failures, slow creation ---------------------------------------------------


class Outputs(BaseModel):
    address: str
    echo: dict[str, Any]


@pipeline("kit-outputs", inputs=Nothing)
def kit_outputs(ctx: Context, inputs: Nothing) -> Outputs:
    db = ctx.declare("docker.container", "db", {"image": "postgres:16", "port": 5432})
    net = ctx.declare("docker.network", "net", {"subnet": "10.0.0.0/24"})
    return Outputs(address=db.ready()["address"], echo=net.ready())


def test_outputs_echo_the_spec_by_default_or_come_from_on_create() -> None:
    world = World()
    world.on_create("docker.container", lambda spec: {"address": f"10.0.0.2:{spec['port']}"})
    result = world.run(kit_outputs)
    output = result.unwrap()
    assert output == Outputs(
        address="10.0.0.2:5432",
        echo={"subnet": "10.0.0.0/24", "id": result.record("net").id, "kind": "docker.network", "name": "net"},
    )
    assert result.record("db").outputs["id"] == result.record("db").id


@pipeline("kit-try-ready", inputs=Nothing)
def kit_try_ready(ctx: Context, inputs: Nothing) -> None:
    good = ctx.declare("test.flaky", "good", {"broken": False})
    bad = ctx.declare("test.flaky", "bad", {"broken": True})
    good.ready()
    _, error = bad.try_ready()
    assert error is not None
    ctx.log(f"bad: {error}", level="warning")
    bad.ready()  # raises: the run fails


def test_a_record_that_fails_creation_makes_ready_raise_resource_failed() -> None:
    def create(spec: dict[str, Any]) -> dict[str, Any]:
        if spec["broken"]:
            raise ConnectionError("no route to the registry")
        return {}

    world = World()
    world.on_create("test.flaky", create)
    result = world.run(kit_try_ready)
    assert result.status == "failed"
    assert isinstance(result.error, ResourceFailed)
    assert result.error.phase == "create_failed"
    assert str(result.error) == "test.flaky/bad is create_failed: ConnectionError: no route to the registry"
    assert [(line.level, line.message) for line in result.logs] == [("warning", f"bad: {result.error}")]
    assert result.record("good").phase == "deleted"
    with pytest.raises(ResourceFailed, match="registry"):
        result.unwrap()
    world.assert_no_leaks()


def test_a_kind_can_fail_every_record() -> None:
    world = World()
    world.kind("test.flaky", fail="quota exceeded")
    result = world.run(kit_try_ready)
    assert "test.flaky/good is create_failed: quota exceeded" in result.error_text


@pipeline("kit-slow", inputs=Nothing)
def kit_slow(ctx: Context, inputs: Nothing) -> None:
    cluster = ctx.declare("k8s.cluster", "c")
    ctx.log("declared")
    cluster.ready()
    ctx.log("ready")


def test_a_slow_kind_moves_the_virtual_clock_while_the_run_waits() -> None:
    world = World()
    world.kind("k8s.cluster", create_seconds=600)
    began = world.now
    result = world.run(kit_slow)
    assert result.succeeded
    assert [line.at - began for line in result.logs] == [timedelta(0), timedelta(minutes=10)]


# --- steps, timers and deadlines ---------------------------------------------------------------


class Build(BaseModel):
    artifact: str
    size: int


ATTEMPTS: list[int] = []


def flaky_build(fail_times: int) -> Build:
    ATTEMPTS.append(1)
    if len(ATTEMPTS) <= fail_times:
        raise OSError("cache lost")
    return Build(artifact="app.tar.gz", size=3)


class StepInputs(BaseModel):
    fail_times: int = 0
    retries: int = 0


class StepReport(BaseModel):
    build: dict[str, Any]
    pair: list[int]


@pipeline("kit-steps", inputs=StepInputs)
def kit_steps(ctx: Context, inputs: StepInputs) -> StepReport:
    # Typed as Build, but like the engine the kit returns the JSON form: a dict.
    build: Any = ctx.step("build", flaky_build, inputs.fail_times, retries=inputs.retries)
    pair = ctx.step("pair", divmod, 7, 2)
    return StepReport(build=build, pair=pair)


def test_steps_run_directly_return_json_and_retry_on_the_virtual_clock() -> None:
    ATTEMPTS.clear()
    world = World()
    began_real, began = time.perf_counter(), world.now
    result = world.run(kit_steps, StepInputs(fail_times=3, retries=3))
    # Results are what the engine returns after a JSON round trip: dicts and lists.
    assert result.unwrap() == StepReport(build={"artifact": "app.tar.gz", "size": 3}, pair=[3, 1])
    assert len(ATTEMPTS) == 4
    assert world.now - began == timedelta(seconds=1 + 2 + 4)  # backoff, without really waiting
    assert time.perf_counter() - began_real < 1.0


def test_a_step_that_keeps_failing_fails_the_run_with_step_failed() -> None:
    ATTEMPTS.clear()
    result = World().run(kit_steps, StepInputs(fail_times=5, retries=1))
    assert isinstance(result.error, StepFailed)
    assert result.error.step == "build"
    assert result.error.error_type == "OSError"
    assert str(result.error) == "step 'build' failed: OSError: cache lost"
    assert len(ATTEMPTS) == 2


@pipeline("kit-bad-step", inputs=Nothing)
def kit_bad_step(ctx: Context, inputs: Nothing) -> None:
    ctx.step("handle", lambda: object())


def test_a_step_result_that_is_not_json_fails_like_in_the_engine() -> None:
    result = World().run(kit_bad_step)
    assert isinstance(result.error, StepFailed)
    assert "cannot be journaled" in str(result.error)


class Pause(BaseModel):
    hours: float


@pipeline("kit-sleeper", inputs=Pause, timeout=timedelta(hours=3))
def kit_sleeper(ctx: Context, inputs: Pause) -> None:
    ctx.declare("docker.volume", "data")
    ctx.sleep(timedelta(hours=inputs.hours))
    ctx.log("woke up")


def test_sleep_moves_the_clock_and_expires_stand_ttls_meanwhile() -> None:
    world = World()
    kept = world.run(kit_example).record("db")  # four hours on the stand
    began = world.now
    result = world.run(kit_sleeper, Pause(hours=2.5))
    assert result.succeeded
    assert world.now - began == timedelta(hours=2.5)
    assert kept.alive
    world.run(kit_sleeper, Pause(hours=2.5))
    assert not kept.alive
    assert kept.deleted_at == began + timedelta(hours=4)


def test_a_run_past_its_deadline_times_out_and_cleans_up() -> None:
    world = World()
    began = world.now
    result = world.run(kit_sleeper, Pause(hours=5))
    assert result.status == "timed_out"
    assert isinstance(result.error, TimeoutError)
    assert result.finished_at == began + timedelta(hours=3)
    assert result.logs == []
    assert result.record("data").deletion_reason == "RunTimedOut"
    world.assert_no_leaks()


# --- child runs --------------------------------------------------------------------------------


class Shard(BaseModel):
    index: int = Field(ge=0)
    fail: bool = False


class ShardReport(BaseModel):
    index: int
    volume: str


@pipeline("kit-shard", inputs=Shard)
def kit_shard(ctx: Context, inputs: Shard) -> ShardReport:
    volume = ctx.declare("docker.volume", f"shard-{inputs.index}")
    if inputs.fail:
        raise RuntimeError(f"shard {inputs.index} failed")
    return ShardReport(index=inputs.index, volume=volume.ready()["id"])


class Fanout(BaseModel):
    shards: int = 3
    failing: list[int] = []


class FanoutReport(BaseModel):
    volumes: list[str]
    failures: int = 0
    failed_inputs: list[int] = []


@pipeline("kit-fanout", inputs=Fanout)
def kit_fanout(ctx: Context, inputs: Fanout) -> FanoutReport:
    shards = [Shard(index=i, fail=i in inputs.failing) for i in range(inputs.shards)]
    try:
        reports = ctx.run_all(kit_shard, shards, concurrency=2)
    except ChildRunFailed as exc:
        return FanoutReport(volumes=[], failures=len(exc.failures), failed_inputs=sorted(exc.by_input))
    return FanoutReport(volumes=[r.volume for r in reports])


def test_children_run_in_process_owned_by_the_parent_run() -> None:
    world = World()
    result = world.run(kit_fanout, Fanout(shards=3))
    report = result.unwrap()
    assert report is not None
    assert [child.pipeline for child in result.children] == ["kit-shard"] * 3
    assert all(child.parent_run_id == result.run_id for child in result.children)
    assert report.volumes == [child.record(f"shard-{i}").id for i, child in enumerate(result.children)]
    assert all(isinstance(child.output, ShardReport) for child in result.children)
    assert len(world.runs) == 4
    world.assert_no_leaks()


def test_a_failed_child_raises_child_run_failed_after_all_children_ended() -> None:
    world = World()
    result = world.run(kit_fanout, Fanout(shards=4, failing=[1, 2]))
    assert result.unwrap() == FanoutReport(volumes=[], failures=2, failed_inputs=[1, 2])
    assert [child.status for child in result.children] == ["succeeded", "failed", "failed", "succeeded"]
    world.assert_no_leaks()


# --- ownership in code and misuse --------------------------------------------------------------


@pipeline("kit-children", inputs=Nothing)
def kit_children(ctx: Context, inputs: Nothing) -> None:
    pods = [ctx.declare("k8s.pod", f"pod-{i}") for i in range(2)]
    deployment = ctx.declare("k8s.deployment", "web", children=pods)
    ctx.to_stand(deployment)


def test_children_are_given_to_the_new_record() -> None:
    world = World()
    result = world.run(kit_children)
    web = result.record("web")
    world.assert_owner(web, "stand:kit-children")
    for name in ("pod-0", "pod-1"):
        world.assert_owner(result.record(name), web)
    assert web.expires_at is None  # no keep_for: it stays until someone deletes it
    world.advance(days=365)
    assert [r.name for r in world.stand(kit_children)] == ["web"]


class Misuse(BaseModel):
    case: str


STASH: dict[str, Any] = {}


@pipeline("kit-misuse", inputs=Misuse)
def kit_misuse(ctx: Context, inputs: Misuse) -> None:
    net = ctx.declare("docker.network", "net")
    STASH["ctx"], STASH[inputs.case] = ctx, net
    if inputs.case == "handed-over-parent":
        ctx.to_stand(net)
        ctx.declare("docker.container", "db", parent=net)
    elif inputs.case == "deleted-parent":
        net.delete()
        ctx.declare("docker.container", "db", parent=net)
    elif inputs.case == "another-runs-parent":
        ctx.declare("docker.container", "db", parent=STASH["stand-clash"])  # the stand holds it
    elif inputs.case == "cycle":
        db = ctx.declare("docker.container", "db", parent=net)
        ctx.declare("docker.container", "sidecar", parent=db, children=[net])
    elif inputs.case == "attached-parent":
        ctx.declare("docker.container", "db", parent=ctx.attach(net.id))  # type: ignore[arg-type]
    elif inputs.case == "root-kind":
        ctx.declare("graphene.stand", "mine")
    elif inputs.case == "not-json":
        ctx.declare("docker.container", "db", {"when": object()})
    elif inputs.case == "stand-clash":
        ctx.to_stand(net)
    elif inputs.case == "own-itself":
        ctx.declare("docker.network", "net", children=[net])
    elif inputs.case == "redeclare-with-children":
        db = ctx.declare("docker.container", "db")
        again = ctx.declare("docker.network", "net", children=[db])
        ctx.declare("docker.network", "net", children=[db])  # the same again: nothing changes
        assert again.id == net.id
        ctx.to_stand(net)
    elif inputs.case == "to-stand-twice":
        ctx.to_stand(net)
        ctx.to_stand(net, keep_for=timedelta(minutes=5))


@pytest.mark.parametrize(
    ("case", "error", "message"),
    [
        ("handed-over-parent", ResourceFailed, "is not a record owned by this run"),
        ("deleted-parent", ResourceFailed, "is deleted; it cannot own new records"),
        ("another-runs-parent", ResourceFailed, "is not a record owned by this run"),
        ("cycle", ResourceFailed, "its own ancestor docker.network/net cannot be its child"),
        ("attached-parent", TypeError, "an Attached handle cannot own"),
        ("root-kind", ResourceFailed, "graphene.stand records are roots"),
        ("not-json", ResourceFailed, "the spec is not JSON"),
        ("own-itself", ResourceFailed, "a record cannot own itself"),
    ],
)
def test_misuse_fails_the_run_with_a_clear_error(case: str, error: type[Exception], message: str) -> None:
    world = World()
    first = world.run(kit_misuse, Misuse(case="stand-clash" if case == "another-runs-parent" else "first"))
    assert first.succeeded
    result = world.run(kit_misuse, Misuse(case=case))
    assert result.status == "failed"
    assert isinstance(result.error, error), result.error_text
    assert message in str(result.error)
    world.assert_no_leaks()


def test_the_stand_holds_one_live_record_per_kind_and_name() -> None:
    world = World()
    assert world.run(kit_misuse, Misuse(case="stand-clash")).succeeded
    again = world.run(kit_misuse, Misuse(case="stand-clash"))
    assert isinstance(again.error, ResourceFailed)
    assert "the stand 'kit-misuse' already holds a docker.network/net" in str(again.error)
    assert "replace=True" in str(again.error)  # the error says what to do


def test_a_redeclared_record_can_be_given_children() -> None:
    world = World()
    result = world.run(kit_misuse, Misuse(case="redeclare-with-children"))
    assert result.succeeded, result.error_text
    world.assert_owner(result.record("db"), result.record("net"))
    world.assert_owner(result.record("net"), kit_misuse)


def test_handing_over_again_sets_the_ttl_again() -> None:
    world = World()
    result = world.run(kit_misuse, Misuse(case="to-stand-twice"))
    assert result.record("net").expires_at == world.now + timedelta(minutes=5)


def test_a_context_cannot_be_used_after_its_run_ended() -> None:
    World().run(kit_misuse, Misuse(case="first"))
    with pytest.raises(RuntimeError, match="has ended"):
        STASH["ctx"].declare("docker.network", "late")


class AttachInputs(BaseModel):
    record_id: str


class Image(BaseModel):
    image: str


@pipeline("kit-attach", inputs=AttachInputs)
def kit_attach(ctx: Context, inputs: AttachInputs) -> Image:
    shared = ctx.attach(inputs.record_id)
    assert isinstance(shared, Attached)
    assert not isinstance(shared, Resource)
    return Image(image=shared.ready()["image"])


def test_an_attached_record_is_read_and_never_owned() -> None:
    world = World()
    db = world.run(kit_example).record("db")
    result = world.run(kit_attach, AttachInputs(record_id=db.id))
    assert result.unwrap() == Image(image="postgres:16")
    world.assert_owner(db, "stand:kit-example")  # attaching did not take it; the run's end left it
    missing = world.run(kit_attach, {"record_id": "nope"})
    assert isinstance(missing.error, ResourceFailed)
    assert "does not exist" in str(missing.error)


class Ids(BaseModel):
    ids: list[str]
    size: int


@pipeline("kit-redeclare", inputs=Nothing)
def kit_redeclare(ctx: Context, inputs: Nothing) -> Ids:
    first = ctx.declare("docker.volume", "v", {"size": 1})
    same = ctx.declare("docker.volume", "v", {"size": 1})
    changed = ctx.declare("docker.volume", "v", {"size": 2})
    return Ids(ids=[first.id, same.id, changed.id], size=changed.ready()["size"])


def test_redeclaring_returns_the_same_record_and_a_changed_spec_is_a_new_generation() -> None:
    world = World()
    result = world.run(kit_redeclare)
    v = result.record("v")
    assert result.output_json == {"ids": [v.id, v.id, v.id], "size": 2}
    assert v.generation == 2


# --- inputs, outputs and the world's own checks ------------------------------------------------


@pipeline("kit-wrong-output", inputs=Nothing)
def kit_wrong_output(ctx: Context, inputs: Nothing) -> Outputs:
    return Build(artifact="x", size=1)  # type: ignore[return-value]


def test_inputs_are_validated_like_a_start_and_outputs_like_the_engine() -> None:
    world = World()
    with pytest.raises(ValidationError):
        world.run(kit_shard, {"index": -1})
    with pytest.raises(TypeError, match="takes Shard"):
        world.run(kit_shard, Nothing())  # type: ignore[misc]  # mypy refuses it too
    assert world.run(kit_shard, {"index": 2}).inputs == {"index": 2, "fail": False}
    wrong = world.run(kit_wrong_output)
    assert isinstance(wrong.error, TypeError)
    assert "must return Outputs or None, not Build" in str(wrong.error)


def test_assert_no_leaks_and_assert_owner_explain_what_is_wrong() -> None:
    world = World()
    result = world.run(kit_stack)
    db = result.record("db")
    with pytest.raises(AssertionError, match=r"docker.container/db .* was deleted at .*RunSucceeded"):
        world.assert_owner(db, result)
    # Tamper with the world to make a leak: the assertion names it and its ownership chain.
    db.phase = "ready"
    result.record("net").phase = "ready"
    with pytest.raises(AssertionError, match=r"2 record\(s\) outlived their owner") as leak:
        world.assert_no_leaks()
    assert f"docker.container/db ({db.id}) <- docker.network/net" in str(leak.value)
    assert f"run:{result.run_id} (kit-stack, succeeded)" in str(leak.value)
    world.assert_owner(db, "record:" + result.record("net").id)
    with pytest.raises(AssertionError, match="is owned by record:"):
        world.assert_owner(db, "stand:kit-stack")
    with pytest.raises(ValueError, match="stand:<pipeline>"):
        world.assert_owner(db, "kit-stack")


def test_lookups_say_what_exists() -> None:
    world = World()
    result = world.run(kit_fanout, Fanout(shards=2))
    with pytest.raises(LookupError, match="no live record named 'missing'"):
        world.record("missing")
    assert world.record("shard-0", include_deleted=True).kind == "docker.volume"
    child = result.children[0]
    assert world.records(run=child, include_deleted=True) == child.records
    assert world.records(owner=f"run:{child.run_id}") == []
    assert isinstance(world.get(child.records[0].id), Record)
    with pytest.raises(LookupError, match="no record"):
        world.get("00000000-0000-0000-0000-000000000000")
    with pytest.raises(ValueError, match="forward"):
        world.advance(seconds=-1)
