"""``agent.put_file``, ``agent.get_file`` and ``agent.run`` in a real run: Celery workers, the web
server (daphne) and an agent process, all on loopback. Each SDK call is one command and one
journal entry; replays (the run suspends for every command) send nothing again."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from graphene_agent import protocol

from apps.agents.choices import CommandKind, CommandStatus
from apps.agents.models import AgentCommand
from apps.agents.services import command_payload_validate
from apps.core.errors import ValidationFailed
from apps.observability.selectors import log_lines
from apps.pipelines import services
from apps.pipelines.choices import TERMINAL, RunStatus
from apps.pipelines.models import JournalEntry, Run
from apps.records.models import Record
from tests.agents import call_pipelines  # registers the agents.calls* pipelines in this process
from tests.conftest import Worker, running_beat, wait_for
from tests.harness.agents import AGENT_SRC
from tests.harness.web import WebServer

PIPELINE_MODULES = "tests.pipelines.sample,tests.agents.call_pipelines"


@pytest.fixture
def setup(web: WebServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's own workers copy os.environ: the server the agents dial, and the pipelines of
    this module (the shared workers know both)."""
    monkeypatch.setenv("GRAPHENE_AGENT_SERVER_URL", web.url)
    monkeypatch.setenv("GRAPHENE_PIPELINE_MODULES", PIPELINE_MODULES)


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Callable[[Path], subprocess.Popen[bytes]]]:
    """Starts the agent with the config a run hands over (as an operator would on the machine)."""
    started: list[subprocess.Popen[bytes]] = []

    def start(env_path: Path) -> subprocess.Popen[bytes]:
        wait_for(env_path.exists, timeout=60, what="the run to hand over the agent's install config")
        with env_path.open("a") as fh:
            fh.write(f"GRAPHENE_AGENT_STATE_DIR={tmp_path / 'state'}\nGRAPHENE_AGENT_BACKOFF_MAX_SECONDS=1\n")
        agent = subprocess.Popen(
            [sys.executable, "-m", "graphene_agent", "--config", str(env_path)],
            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(AGENT_SRC), "HOME": str(tmp_path)},
            stdout=(tmp_path / "agent.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.kill()
        agent.wait(timeout=30)


def wait_run(run: Run, logs: Path, timeout: float = 120) -> Run:
    try:
        wait_for(lambda: Run.objects.get(pk=run.pk).status in TERMINAL, timeout=timeout, what=f"run {run.pk} to end")
    except AssertionError as exc:  # say where it stood
        fresh = Run.objects.get(pk=run.pk)
        journal = list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("call", "status", "error"))
        commands = list(AgentCommand.objects.order_by("created_at").values_list("kind", "status", "error"))
        tails = {p.name: p.read_text(errors="replace")[-2000:] for p in sorted(logs.glob("*.log"))}
        raise AssertionError(f"{exc}: {fresh.status} {journal} {commands} {tails}") from None
    return Run.objects.get(pk=run.pk)


def commands_of(run: Run) -> dict[str, int]:
    box = Record.objects.get(created_by_run_id=run.record_id, kind="agent")
    kinds = AgentCommand.objects.filter(agent=box).values_list("kind", flat=True)
    return {kind: list(kinds).count(kind) for kind in set(kinds)}


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_a_run_puts_reads_and_runs_functions_on_the_machine(
    web: WebServer,
    workers: list[Worker],
    machine: Callable[[Path], subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    env_path, folder = tmp_path / "agent.env", tmp_path / "machine"
    run = services.run_start(pipeline_name="agents.calls", inputs={"env_path": str(env_path), "folder": str(folder)})
    agent = machine(env_path)

    run = wait_run(run, tmp_path)
    assert run.status == RunStatus.SUCCEEDED, run.error + (tmp_path / "agent.log").read_text()[-3000:]
    out = call_pipelines.CallOutput.model_validate(run.outputs)

    # put_file wrote the file, with its mode, and reported its size and digest; get_file read it.
    text = b"one\ntwo\nthree\n"
    lines = folder / "data" / "lines.txt"
    assert lines.read_bytes() == text
    assert lines.stat().st_mode & 0o777 == 0o640
    assert out.written == {"path": str(lines), "size": len(text), "sha256": hashlib.sha256(text).hexdigest()}
    assert out.read_back == text.decode()
    assert (folder / "big.bin").read_bytes() == call_pipelines.BIG
    assert out.big_written == {
        "size": len(call_pipelines.BIG),
        "sha256": hashlib.sha256(call_pipelines.BIG).hexdigest(),
    }

    # The function ran on the machine: in a process the agent started, not in the worker.
    assert out.counted["lines"] == 3
    assert out.counted["sha256"] == hashlib.sha256(text).hexdigest()
    assert out.counted["ppid"] == agent.pid
    assert out.counted["pid"] not in (out.worker_pid, agent.pid, os.getpid())
    assert out.big_counted["sha256"] == hashlib.sha256(call_pipelines.BIG).hexdigest()
    assert out.big_counted["pid"] != out.counted["pid"]  # a fresh interpreter per call

    # What the function raised there is a RemoteError here, with its type, message and traceback.
    assert out.remote["type"] == "PermissionError"
    assert out.remote["message"] == f"keep out: {lines}"
    assert out.remote["error"] == f"refuse() on agent/box raised PermissionError: keep out: {lines}"
    assert 'raise PermissionError(f"{why}: {path}")' in out.remote["traceback"]
    assert "call_runner" not in out.remote["traceback"]

    assert out.too_big == (
        f"get_file {folder}/too-big.bin on agent/box failed: {folder}/too-big.bin is {600 * 1024} bytes; "
        f"get_file returns at most {512 * 1024}"
    )

    # A timeout kills the function's process (group), as it does an exec's.
    assert out.timed_out == (
        "mark_and_wait() on agent/box did not return: timed out after 0.5s: the process group was killed"
    )
    assert len((folder / "slow").read_text().splitlines()) == 1

    # Bad inputs were refused in the SDK, each with its reason, and sent nothing.
    refused = out.refused
    assert refused["lambda"].startswith("TypeError: agent.run takes a function defined with def")
    assert "a lambda's source cannot be sent" in refused["lambda"]
    assert refused["closure"] == (
        "TypeError: agent.run cannot send _refusals.<locals>.closure(): it uses offset from its enclosing "
        "function (a closure), and only its source travels to the machine; pass offset as arguments"
    )
    assert "len() is a builtin" in refused["builtin"]
    assert refused["module global"].startswith(
        "TypeError: agent.run cannot send _uses_the_module(): it uses BIG from its module, which will not exist"
    )
    assert refused["non-JSON argument"].startswith(
        "TypeError: agent.run: args[0]['path'] of count_lines() is a set, which is not JSON-serializable"
    )
    assert refused["bad arguments"] == (
        "TypeError: agent.run: count_lines() cannot be called with these arguments: too many positional arguments"
    )
    assert refused["get_file limit"].startswith("ValueError: get_file reads at most 524288 bytes")
    assert refused["relative path"].startswith("ValueError: put_file needs an absolute path")
    assert refused["put_file limit"].startswith("ValueError: put_file carries at most 524288 bytes (512 KiB)")

    # One command per call, whatever the number of replays (the run suspended on each).
    assert commands_of(run) == {"put_file": 2, "get_file": 2, "call": 5}
    assert run.attempt >= 8
    calls = list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("call", flat=True))
    assert calls == [
        "agent box",
        "step install",
        f"put_file agent/box {lines}",
        f"get_file agent/box {lines}",
        f"put_file agent/box {folder}/big.bin",
        "call agent/box count_lines",
        "call agent/box count_lines",
        "step worker pid",
        "call agent/box refuse",
        "call agent/box write_file",
        f"get_file agent/box {folder}/too-big.bin",
        "call agent/box mark_and_wait",
    ]
    # The journal holds command ids, sizes and digests: never a file's content.
    entries = {e.seq: (e.status, e.result or {}) for e in JournalEntry.objects.filter(run=run)}
    assert set(entries[3][1]) == {"command", "size", "sha256"}
    assert set(entries[4][1]) == {"command", "size", "sha256"}
    assert entries[6][1]["value"] == out.counted
    assert (entries[9][0], entries[9][1]["remote"]["type"]) == ("failed", "PermissionError")
    assert entries[11][0] == "failed"
    # A delivered put_file keeps its size and digest, not its content.
    for put in AgentCommand.objects.filter(kind=CommandKind.PUT_FILE):
        assert put.status == CommandStatus.SUCCEEDED
        assert "data" not in put.payload
        assert put.result["size"] in (len(text), len(call_pipelines.BIG))
    # The function's output streamed into the run's log, as exec output does.
    assert run.record_id is not None
    run_log = log_lines(record=Record.objects.get(pk=run.record_id))
    counted = [m.strip() for m in run_log.values_list("message", flat=True) if m.strip() == f"counted {lines}"]
    assert counted == [f"counted {lines}"], "once: the run's log reads it on its agent's record"


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_a_function_raising_on_the_machine_fails_the_run_with_remote_error(
    web: WebServer,
    workers: list[Worker],
    machine: Callable[[Path], subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    env_path = tmp_path / "agent.env"
    run = services.run_start(pipeline_name="agents.calls_fail", inputs={"env_path": str(env_path)})
    machine(env_path)

    run = wait_run(run, tmp_path)

    assert run.status == RunStatus.FAILED
    first, _, rest = run.error.partition("\n")
    assert first == "RemoteError: refuse() on agent/box raised PermissionError: no entry: /srv/secret"
    assert "On the machine:" in rest
    assert rest.rstrip().endswith("PermissionError: no entry: /srv/secret")
    assert 'File "<agent.run refuse>", line 3, in refuse' in rest
    entry = JournalEntry.objects.get(run=run, call="call agent/box refuse")
    assert entry.status == "failed"
    assert (entry.result or {})["remote"]["message"] == "no entry: /srv/secret"
    assert commands_of(run) == {"call": 1}


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_while_the_function_runs_does_not_run_it_again(
    setup: None,
    start_worker: Callable[..., Worker],
    machine: Callable[[Path], subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    worker = start_worker()
    env_path, marker = tmp_path / "agent.env", tmp_path / "marker"
    run = services.run_start(
        pipeline_name="agents.calls_slow", inputs={"env_path": str(env_path), "marker": str(marker), "seconds": 4}
    )
    machine(env_path)
    call = wait_for(
        lambda: AgentCommand.objects.filter(kind=CommandKind.CALL, status=CommandStatus.RUNNING).first(),
        timeout=60,
        what="the function to start on the machine",
    )
    assert call is not None
    entry = JournalEntry.objects.get(run=run, call="call agent/box mark_and_wait")
    assert (entry.status, entry.result) == ("started", {"command": str(call.pk)})

    worker.kill()
    with running_beat(tmp_path):  # the lease sweeper, should the run have held its lease
        start_worker()
        run = wait_run(run, tmp_path)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.outputs == {"lines": 1}
    assert len(marker.read_text().splitlines()) == 1  # it ran once
    assert commands_of(run) == {"call": 1}
    entry.refresh_from_db()
    assert (entry.status, entry.result) == ("completed", {"command": str(call.pk), "value": 1})


# --- the server's checks of a call command (the SDK checks first; the API may not) ----------------

SOURCE = "def f(x):\n    return x\n"


def test_a_call_payload_is_normalized() -> None:
    clean = command_payload_validate(CommandKind.CALL, {"name": "f", "source": SOURCE, "args": [1]})
    assert clean == {"name": "f", "source": SOURCE, "args": [1], "kwargs": {}, "timeout": None}


@pytest.mark.parametrize(
    ("payload", "field", "message"),
    [
        ({"name": "f"}, "source", "required: the function's source code"),
        ({"name": "f", "source": "def f():\x00"}, "source", "contains a NUL byte"),
        ({"name": "f", "source": "#" * (128 * 1024)}, "source", "a call carries"),
        ({"name": "not a name", "source": SOURCE}, "name", "must be the function's name"),
        ({"name": "class", "source": SOURCE}, "name", "must be the function's name"),
        ({"name": "f", "source": SOURCE, "args": {"x": 1}}, "args", "must be a list"),
        ({"name": "f", "source": SOURCE, "kwargs": [1]}, "kwargs", "must be an object"),
        ({"name": "f", "source": SOURCE, "kwargs": {"not-a-name": 1}}, "kwargs.not-a-name", "not a parameter name"),
        ({"name": "f", "source": SOURCE, "args": ["x" * (512 * 1024)]}, "args", "a call carries"),
        ({"name": "f", "source": SOURCE, "timeout": 0}, "timeout", "must be more than 0"),
        ({"name": "f", "source": SOURCE, "cwd": "/"}, "cwd", "unknown field"),
    ],
)
def test_a_bad_call_payload_names_its_field(payload: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        command_payload_validate(CommandKind.CALL, payload)
    assert field in caught.value.fields
    assert message in str(caught.value)


def test_a_put_file_larger_than_one_message_is_refused() -> None:
    data = base64.b64encode(b"\0" * (protocol.MAX_PUT_FILE_BYTES + 1)).decode()
    with pytest.raises(ValidationFailed, match="more than the 524288 a put_file carries"):
        command_payload_validate(CommandKind.PUT_FILE, {"path": "/x", "data": data})
