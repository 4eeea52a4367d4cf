"""Pipelines the tests run (loaded by the test settings through GRAPHENE_PIPELINE_MODULES).

Side effects are appended to files under the data directory so that tests, running in
another process than the workers, can count how many times a step really executed.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Literal

from django.conf import settings
from graphene_sdk import ChildRunFailed, Context, Guarantee, OutcomeUnknown, ResourceFailed, pipeline
from pydantic import BaseModel, Field


def effects_file(run_id: str, name: str) -> Path:
    folder = Path(settings.DATA_DIR) / "effects"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{run_id}-{name}"


def effect(run_id: str, name: str, value: str = "x") -> str:
    with effects_file(run_id, name).open("a") as fh:
        fh.write(value + "\n")
    return value


def effect_count(run_id: str, name: str) -> int:
    path = effects_file(run_id, name)
    return len(path.read_text().splitlines()) if path.exists() else 0


class TreeInputs(BaseModel):
    branches: int = Field(default=2, ge=1, le=10)
    leaves: int = Field(default=2, ge=0, le=10)
    create_ms: int = Field(default=0, ge=0)
    step_ms: int = Field(default=0, ge=0)


class TreeOutput(BaseModel):
    records: int
    steps: list[str]


@pipeline("sample.tree", inputs=TreeInputs)
def tree(ctx: Context, inputs: TreeInputs) -> TreeOutput:
    """A small environment: branches with leaves; waits on the branches, runs a step per branch."""
    branches = [
        ctx.declare("test.sleep", f"branch-{b}", {"create_ms": inputs.create_ms}) for b in range(inputs.branches)
    ]
    leaves = [
        ctx.declare("test.sleep", f"leaf-{b}-{i}", {"create_ms": inputs.create_ms}, parent=branch)
        for b, branch in enumerate(branches)
        for i in range(inputs.leaves)
    ]
    done = []
    for branch in branches:
        outputs = branch.ready()
        ctx.log(f"{branch.name} is ready: {outputs['object']}")
        done.append(ctx.step(f"use-{branch.name}", _work, ctx.run_id, branch.name, inputs.step_ms))
    return TreeOutput(records=len(branches) + len(leaves), steps=done)


def _work(run_id: str, name: str, ms: int) -> str:
    time.sleep(ms / 1000)
    return effect(run_id, f"work-{name}", name)


class StepInputs(BaseModel):
    guarantee: Guarantee = "at_least_once"
    seconds: float = 0.0
    catch_unknown: bool = False
    gate: str = ""  # the step also waits while this gate is closed (kinds.testing.gate_wait)


@pipeline("sample.step", inputs=StepInputs)
def one_step(ctx: Context, inputs: StepInputs) -> None:
    """One slow step that leaves a trace each time it really starts."""
    try:
        ctx.step("act", _slow, ctx.run_id, inputs.seconds, inputs.gate, guarantee=inputs.guarantee)
    except OutcomeUnknown:
        effect(ctx.run_id, "outcome-unknown")
        if not inputs.catch_unknown:
            raise
    ctx.step("after", effect, ctx.run_id, "after")


def _slow(run_id: str, seconds: float, gate: str = "") -> str:
    from kinds.testing import gate_wait

    effect(run_id, "act-started")
    time.sleep(seconds)
    if gate:
        gate_wait(gate)
    return effect(run_id, "act-finished")


class Empty(BaseModel):
    pass


@pipeline("sample.diverge", inputs=Empty)
def diverge(ctx: Context, inputs: Empty) -> None:
    """Calls change when the flag file exists, as if the code changed between attempts."""
    ctx.step("first", effect, ctx.run_id, "first")
    if effects_file(ctx.run_id, "flag").exists():
        ctx.step("renamed", effect, ctx.run_id, "renamed")
    else:
        ctx.step("second", effect, ctx.run_id, "second")
    ctx.sleep(30)


@pipeline("sample.sleep", inputs=Empty)
def sleeper(ctx: Context, inputs: Empty) -> None:
    ctx.step("before", effect, ctx.run_id, "before")
    ctx.sleep(1.0)
    ctx.step("after", effect, ctx.run_id, "after")


class FailInputs(BaseModel):
    retries: int = 0
    fail_times: int = 10


@pipeline("sample.fail", inputs=FailInputs)
def failing(ctx: Context, inputs: FailInputs) -> None:
    """A declared record, then a step that fails ``fail_times`` times."""
    ctx.declare("test.sleep", "doomed")
    ctx.step("flaky", _flaky, ctx.run_id, inputs.fail_times, retries=inputs.retries)


def _flaky(run_id: str, fail_times: int) -> str:
    if effect_count(run_id, "flaky") < fail_times:
        effect(run_id, "flaky")
        raise RuntimeError("boom")
    return "ok"


class NoopInputs(BaseModel):
    steps: int = Field(default=200, ge=0, le=100_000)


@pipeline("sample.noop", inputs=NoopInputs)
def noop(ctx: Context, inputs: NoopInputs) -> None:
    """``steps`` no-op checkpointed steps (the step-overhead benchmark)."""
    for i in range(inputs.steps):
        ctx.step(f"noop-{i}", _noop)


def _noop() -> None:
    return None


@pipeline("sample.team-b", inputs=NoopInputs, namespace="team-b")
def team_b(ctx: Context, inputs: NoopInputs) -> None:
    """A pipeline of another namespace than the default one (the access tests)."""
    for i in range(inputs.steps):
        ctx.step(f"noop-{i}", _noop)


class WaitInputs(BaseModel):
    create_ms: int = 0
    failures: int = 0


class WaitOutput(BaseModel):
    ok: bool
    error: str
    pid: int


@pipeline("sample.wait", inputs=WaitInputs)
def wait_one(ctx: Context, inputs: WaitInputs) -> WaitOutput:
    """Waits on one record (test.flaky: fails permanently when ``failures`` > 0)."""
    spec = {"create_ms": inputs.create_ms, "create_failures": inputs.failures, "permanent": inputs.failures > 0}
    _, error = ctx.declare("test.flaky", "thing", spec).try_ready()
    return WaitOutput(ok=error is None, error=str(error) if error else "", pid=os.getpid())


@pipeline("sample.badspec", inputs=Empty)
def badspec(ctx: Context, inputs: Empty) -> None:
    """A refused declaration is an error the program can handle, and replays identically."""
    try:
        ctx.declare("test.sleep", "wrong", {"bogus": 1})
    except ResourceFailed as exc:
        ctx.step("handled", effect, ctx.run_id, "handled", str(exc))
    ctx.sleep(0.3)  # suspends: the next attempt replays the failed declaration
    ctx.step("after", effect, ctx.run_id, "after")


@pipeline("sample.deadline", inputs=Empty, timeout=timedelta(seconds=2))
def deadline(ctx: Context, inputs: Empty) -> None:
    """Declares a record and sleeps past its two-second deadline."""
    ctx.declare("test.sleep", "held")
    ctx.sleep(60)


# --- stands, ownership, concurrency and child runs ----------------------------------------


class HandoffInputs(BaseModel):
    keep_seconds: float | None = 3600
    replace: bool = False


@pipeline("sample.handoff", inputs=HandoffInputs)
def handoff(ctx: Context, inputs: HandoffInputs) -> None:
    """Builds net -> (db -> data, app); hands db (with its child) to the stand."""
    net = ctx.declare("test.sleep", "net")
    db = ctx.declare("test.sleep", "db", parent=net)
    ctx.declare("test.sleep", "data", parent=db)
    ctx.declare("test.sleep", "app", parent=net)
    db.ready()
    keep_for = timedelta(seconds=inputs.keep_seconds) if inputs.keep_seconds else None
    ctx.to_stand(db, keep_for=keep_for, replace=inputs.replace)


@pipeline("sample.keep", inputs=Empty, keep_on_failure=timedelta(hours=1))
def keep_on_failure(ctx: Context, inputs: Empty) -> None:
    """Fails after building an environment, which the stand keeps for an hour."""
    env = ctx.declare("test.sleep", "env")
    ctx.declare("test.sleep", "inner", parent=env)
    env.ready()
    raise RuntimeError("the smoke test failed")


class TurnInputs(BaseModel):
    label: str
    seconds: float = 0.5


@pipeline("sample.queue", inputs=TurnInputs, concurrency="queue", max_pending=2)
def queued(ctx: Context, inputs: TurnInputs) -> None:
    ctx.step("turn", _turn, ctx.run_id, inputs.label, inputs.seconds)


def _turn(run_id: str, label: str, seconds: float) -> str:
    effect("queue", "order", f"start {label} {time.time()}")
    time.sleep(seconds)
    effect("queue", "order", f"end {label} {time.time()}")
    return label


@pipeline("sample.replace", inputs=Empty, concurrency="cancel_previous")
def replace(ctx: Context, inputs: Empty) -> None:
    ctx.declare("test.sleep", "deployment").ready()
    ctx.sleep(60)


class ChildInputs(BaseModel):
    index: int
    seconds: float = 0.3
    tag: str = "children"
    fail: bool = False


class ChildOutput(BaseModel):
    index: int
    square: int


@pipeline("sample.child", inputs=ChildInputs)
def child(ctx: Context, inputs: ChildInputs) -> ChildOutput:
    ctx.declare("test.sleep", f"scratch-{inputs.index}")
    ctx.step("work", _child_work, inputs.index, inputs.seconds, inputs.tag)
    if inputs.fail:
        raise RuntimeError(f"child {inputs.index} was told to fail")
    return ChildOutput(index=inputs.index, square=inputs.index**2)


def _child_work(index: int, seconds: float, tag: str) -> int:
    effect(tag, "spans", f"start {index} {time.time()}")
    time.sleep(seconds)
    effect(tag, "spans", f"end {index} {time.time()}")
    return index


class ParentInputs(BaseModel):
    count: int = 10
    concurrency: int = 3
    seconds: float = 0.3
    tag: str = "children"
    failing: list[int] = []  # the children (by index) that fail


class ParentOutput(BaseModel):
    squares: list[int]
    failed: dict[int, str] = {}  # ChildRunFailed.by_input, when children failed


@pipeline("sample.parent", inputs=ParentInputs)
def parent(ctx: Context, inputs: ParentInputs) -> ParentOutput:
    try:
        outputs = ctx.run_all(
            child,
            [
                ChildInputs(index=i, seconds=inputs.seconds, tag=inputs.tag, fail=i in inputs.failing)
                for i in range(inputs.count)
            ],
            concurrency=inputs.concurrency,
        )
    except ChildRunFailed as exc:
        return ParentOutput(squares=[], failed=exc.by_input)
    return ParentOutput(squares=[o.square for o in outputs])


class AttachInputs(BaseModel):
    record_id: str


@pipeline("sample.attach", inputs=AttachInputs)
def attach(ctx: Context, inputs: AttachInputs) -> WaitOutput:
    """Waits on a record another run owns, read-only."""
    other = ctx.attach(inputs.record_id)
    outputs = other.ready()
    return WaitOutput(ok=True, error=str(outputs.get("object")), pid=os.getpid())


@pipeline("sample.adopt", inputs=Empty)
def adopt(ctx: Context, inputs: Empty) -> None:
    """children=: a group record becomes the owner of two records declared before it."""
    first = ctx.declare("test.sleep", "first")
    second = ctx.declare("test.sleep", "second")
    group = ctx.declare("test.sleep", "group", children=[first, second])
    group.ready()
    ctx.to_stand(group)


class AgentInputs(BaseModel):
    env_path: str
    secret: str = ""  # with a name: a third command gets that secret in its environment


class AgentOutput(BaseModel):
    exit_code: int
    stdout: str
    stderr: str
    greeting: str
    secret_digest: str = ""


def _write_private(path: str, text: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return path


@pipeline("sample.agent", inputs=AgentInputs)
def on_a_machine(ctx: Context, inputs: AgentInputs) -> AgentOutput:
    """Declares an agent, hands its install config over, runs two commands on it."""
    box = ctx.agent("box", labels={"role": "test"})
    ctx.step("install", _write_private, inputs.env_path, box.install_env())
    first = box.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
    second = box.exec(["sh", "-c", 'echo "$GREETING from $(pwd)"'], env={"GREETING": "hello"}, cwd="/tmp")
    digest = ""
    if inputs.secret:  # the value reaches the program; only its digest comes back
        script = 'printf %s "$TOKEN" | sha256sum | cut -d" " -f1'
        digest = box.exec(["sh", "-c", script], env={"TOKEN": ctx.secret(inputs.secret), "PLAIN": "x"}).stdout_tail
    return AgentOutput(
        exit_code=first.exit_code,
        stdout=first.stdout_tail,
        stderr=first.stderr_tail,
        greeting=second.stdout_tail,
        secret_digest=digest.strip(),
    )


class DriftInputs(BaseModel):
    path: str


@pipeline("sample.drift", inputs=DriftInputs)
def drift_options(ctx: Context, inputs: DriftInputs) -> None:
    """A file watched every 5 s whose drift is only reported."""
    config = ctx.declare(
        "file",
        "config",
        {"path": inputs.path, "content": "x\n"},
        reconcile_every=timedelta(seconds=5),
        on_drift="report",
    )
    config.ready()


class ProtectInputs(BaseModel):
    hold_seconds: float = Field(default=600, ge=0)


@pipeline("sample.protect", inputs=ProtectInputs)
def protected_env(ctx: Context, inputs: ProtectInputs) -> None:
    """An environment whose database is declared protected (with a volume of its own), beside
    a cache and a web server; holds it until cancelled. Once the flag file ``unprotect`` exists
    the program declares the database without protection, as if its code changed."""
    env = ctx.declare("test.sleep", "env")
    db = ctx.declare("test.sleep", "db", parent=env, protect=not effects_file(ctx.run_id, "unprotect").exists())
    ctx.declare("test.sleep", "volume", parent=db)
    ctx.declare("test.sleep", "cache", parent=env)
    ctx.declare("test.sleep", "web")
    db.ready()
    ctx.sleep(inputs.hold_seconds)


class FileInputs(BaseModel):
    folder: str


@pipeline("sample.files", inputs=FileInputs)
def files(ctx: Context, inputs: FileInputs) -> None:
    """Writes three files through graphene_sdk.libs.file, then holds them until cancelled."""
    from graphene_sdk.libs.file import file

    notes = file(ctx, "notes", path=f"{inputs.folder}/notes.txt", content="hello\n")
    raw = file(ctx, "raw", path=f"{inputs.folder}/raw.txt", content=b"bytes too\n", mode=0o600)
    token = file(ctx, "token", path=f"{inputs.folder}/token", content=ctx.secret("deploy-token"), mode=0o600)
    for handle in (notes, raw, token):
        handle.ready()
    ctx.sleep(600)


class NulInputs(BaseModel):
    where: str = "output"  # or "step"
    retries: int = 0


class NulOutput(BaseModel):
    text: str


@pipeline("sample.nul", inputs=NulInputs)
def nul(ctx: Context, inputs: NulInputs) -> NulOutput:
    """A NUL character where PostgreSQL cannot store it: in a step's result or the run's output."""
    if inputs.where == "step":
        ctx.step("nul", _nul, ctx.run_id, retries=inputs.retries)
    return NulOutput(text="a\x00b")


def _nul(run_id: str) -> str:
    effect(run_id, "nul")  # counted: a value that cannot be journaled is not worth running again
    return "x\x00y"


class StudioInputs(BaseModel):
    parts: int = Field(default=2, ge=1, le=10)
    create_ms: int = Field(default=800, ge=0)
    lines: int = Field(default=3, ge=0, le=100)


@pipeline("sample.studio", inputs=StudioInputs)
def studio(ctx: Context, inputs: StudioInputs) -> None:
    """What the Studio's browser tests watch: records that take a moment to converge, log lines,
    then a long durable sleep (until someone cancels the run)."""
    parts = [ctx.declare("test.sleep", f"part-{i}", {"create_ms": inputs.create_ms}) for i in range(inputs.parts)]
    for part in parts:
        part.ready()
    for i in range(inputs.lines):
        ctx.log(f"hello from the run, line {i}")
    ctx.sleep(timedelta(minutes=10))


class Database(BaseModel):
    host: str = "db.internal"
    port: int = Field(default=5432, ge=1, le=65535)


class FormInputs(BaseModel):
    """Every kind of field the Studio's start form lays out."""

    branch: str
    replicas: int = Field(default=1, ge=1, le=10, description="how many copies")
    ratio: float = 0.5
    mode: Literal["fast", "safe"] = "safe"
    tags: list[str] = Field(default_factory=list)
    dry_run: bool = False
    note: str | None = None
    db: Database = Field(default_factory=Database)


@pipeline("sample.form", inputs=FormInputs)
def form(ctx: Context, inputs: FormInputs) -> None:
    """Takes every kind of input (the Studio's start form); does nothing with them."""
    ctx.log(f"started on {inputs.branch}")


class ChatterInputs(BaseModel):
    lines: int = Field(default=3, ge=0, le=100)
    gap_ms: int = Field(default=0, ge=0, le=5000)
    hold: bool = False
    fail: bool = False


class ChatterOutput(BaseModel):
    lines: int


@pipeline("sample.chatter", inputs=ChatterInputs)
def chatter(ctx: Context, inputs: ChatterInputs) -> ChatterOutput:
    """What the SDK client's tests read: labelled records (``env`` with ``inner`` is handed to
    the stand), log lines ``gap_ms`` apart (durable sleeps), then, with ``hold``, a long sleep
    (until cancelled); with ``fail``, an error at the end."""
    env = ctx.declare("test.sleep", "env", labels={"team": "sdk", "role": "db"})
    ctx.declare("test.sleep", "inner", parent=env, labels={"team": "sdk"})
    ctx.declare("test.sleep", "cache", labels={"team": "web"})
    env.ready()
    for i in range(inputs.lines):
        ctx.log(f"chatter line {i}")
        if inputs.gap_ms:
            ctx.sleep(inputs.gap_ms / 1000)
    ctx.to_stand(env, keep_for=timedelta(hours=1), replace=True)
    if inputs.hold:
        ctx.sleep(timedelta(minutes=10))
    if inputs.fail:
        raise RuntimeError("asked to fail")
    return ChatterOutput(lines=inputs.lines)


class CliInputs(BaseModel):
    lines: int = Field(default=2, ge=0, le=100)
    hold_seconds: float = Field(default=0, ge=0)
    fail: bool = False


class CliRefused(Exception):
    """Raised by ``sample.cli``: a class of the pipeline's own module, named by its path in a
    traceback (``tests.pipelines.sample.CliRefused``)."""


@pipeline("sample.cli", inputs=CliInputs)
def cli(ctx: Context, inputs: CliInputs) -> None:
    """What graphenectl's tests watch: a record owning another, log lines, a durable pause, and
    a failure of the program's own."""
    box = ctx.declare("test.sleep", "box", {"create_ms": 100})
    ctx.declare("test.sleep", "inner", parent=box)
    box.ready()
    for i in range(inputs.lines):
        ctx.log(f"line {i} from the run")
    if inputs.hold_seconds:
        ctx.sleep(inputs.hold_seconds)
    if inputs.fail:
        raise CliRefused("the smoke test said no")
