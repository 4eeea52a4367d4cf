"""The SDK surface is a contract: exported names, typed starts, decorator checks, examples."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import graphene_sdk
import pytest
from graphene_sdk import pipeline
from pydantic import BaseModel

from apps.core.errors import ValidationFailed
from apps.pipelines import services
from tests.conftest import REPO


def test_exported_names_are_pinned() -> None:
    assert sorted(graphene_sdk.__all__) == [
        "Agent",
        "ArtifactInfo",
        "ArtifactRef",
        "Attached",
        "AttachedAgent",
        "ChildRunFailed",
        "Client",
        "ClientError",
        "ConcurrencyLimit",
        "ConfigError",
        "Context",
        "ExecResult",
        "GrapheneError",
        "Guarantee",
        "JournalEntry",
        "LogLine",
        "Need",
        "NonDeterminismError",
        "OutcomeUnknown",
        "OwnerRef",
        "Page",
        "Paged",
        "Pipeline",
        "PutFileResult",
        "RecordEvent",
        "RecordInfo",
        "RemoteError",
        "Resource",
        "ResourceFailed",
        "RunCancelled",
        "RunEvent",
        "RunHandle",
        "RunInfo",
        "SecretRef",
        "StandHolding",
        "StandInfo",
        "StandSummary",
        "StepFailed",
        "StepTimeout",
        "TreeNode",
        "UpstreamRun",
        "cron",
        "need",
        "pipeline",
        "registered",
        "upstream",
        "webhook",
    ]
    for error in (
        "ResourceFailed",
        "StepFailed",
        "OutcomeUnknown",
        "NonDeterminismError",
        "ClientError",
        "ConfigError",
        "RemoteError",
    ):
        assert issubclass(getattr(graphene_sdk, error), graphene_sdk.GrapheneError)


# mypy's cache for the programs these tests check: kept across the tests and across sessions
# (incremental: a changed SDK is checked again), one per pytest-xdist worker (they may run at once).
MYPY_CACHE = REPO / ".mypy_cache" / f"sdk-users-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


def run_mypy(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """``mypy --strict`` on ``body`` as a user's module, with the SDK on its path."""
    source = tmp_path / "client_use.py"
    source.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(MYPY_CACHE), str(source)],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "MYPYPATH": str(REPO / "sdk")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


PROGRAM = """
    from graphene_sdk import Client, Context, pipeline
    from pydantic import BaseModel

    class Inputs(BaseModel):
        branch: str = "main"

    class Other(BaseModel):
        count: int = 1

    class Report(BaseModel):
        ok: bool

    @pipeline("integration", inputs=Inputs)
    def integration(ctx: Context, inputs: Inputs) -> Report:
        return Report(ok=True)

    client = Client("http://127.0.0.1:8000", token="t")
    handle = client.start(integration, {ARG})
    report: Report = handle.result()
"""


@pytest.mark.xdist_group("mypy")  # the tests that run mypy share its cache: one worker runs them
def test_mypy_accepts_the_right_inputs_and_rejects_a_wrong_type(tmp_path: Path) -> None:
    good = run_mypy(tmp_path, PROGRAM.replace("{ARG}", 'Inputs(branch="dev")'))
    assert good.returncode == 0, good.stdout + good.stderr
    bad = run_mypy(tmp_path, PROGRAM.replace("{ARG}", "Other(count=2)"))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    # mypy reports it on the start() line: the pipeline fixes the input type, Other cannot be it.
    lines = textwrap.dedent(PROGRAM).splitlines()
    start_line = next(n for n, line in enumerate(lines, start=1) if "client.start(" in line)
    assert f"client_use.py:{start_line}: error:" in bad.stdout, bad.stdout
    assert '"start" of "Client"' in bad.stdout


READER = """
    from pathlib import Path

    from graphene_sdk import ArtifactInfo, Client, LogLine, RecordInfo, RunEvent, StandInfo, TreeNode

    client = Client(context="ci")
    ready: list[RecordInfo] = list(client.records.list(labels={"team": "ci"}, phase=["ready"]))
    tree: TreeNode = client.records.tree(ready[0].id, depth=2)
    last: list[LogLine] = client.logs.tail(ready[0].id, 20, severity="warning")
    for line in client.logs.follow(ready[0].id, tail=10):
        text: str = line.message
    moves: list[RunEvent] = list(client.runs.watch("run-id", timeout=60))
    stand: StandInfo = client.stands.get("build")
    artifact: ArtifactInfo = client.artifacts.put(b"x", name="a.txt", owner=client.stands.ensure("build"))
    saved: Path = client.artifacts.download(artifact, Path("out"))
    data: bytes = client.artifacts.read(artifact.id)
    {WRONG}
"""


@pytest.mark.xdist_group("mypy")
def test_mypy_checks_what_the_client_reads(tmp_path: Path) -> None:
    good = run_mypy(tmp_path, READER.replace("{WRONG}", "pass"))
    assert good.returncode == 0, good.stdout + good.stderr
    bad = run_mypy(tmp_path, READER.replace("{WRONG}", 'phase: int = client.records.get("id").phase'))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert 'Incompatible types in assignment (expression has type "str", variable has type "int")' in bad.stdout


def test_decorator_refuses_bad_definitions() -> None:
    class Inputs(BaseModel):
        x: int = 0

    with pytest.raises(ValueError, match="name"):
        pipeline("bad name!", inputs=Inputs)
    with pytest.raises(TypeError, match="pydantic"):
        pipeline("ok", inputs=dict)  # type: ignore[type-var]
    with pytest.raises(ValueError, match="concurrency"):
        pipeline("ok", inputs=Inputs, concurrency="whenever")  # type: ignore[arg-type]


@pytest.mark.django_db
def test_the_examples_load_with_their_schemas() -> None:
    # GRAPHENE_PIPELINE_DIRS (the examples) are delivered as revisions of a local source.
    loaded = {name: services.definition_get(name) for name in ("hello", "environment", "release")}
    schema = loaded["environment"].input_schema()
    assert schema["properties"]["replicas"]["maximum"] == 10
    assert loaded["release"].output is not None
    with pytest.raises(ValidationFailed) as bad:
        services.inputs_validate(loaded["release"], {"version": "one"})
    assert "inputs.version" in bad.value.fields
