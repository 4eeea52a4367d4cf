"""A pipeline acts on a machine through an agent: declare, install, exec (real processes)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from apps.agents import services as agents
from apps.agents.models import AgentCommand
from apps.core.errors import ValidationFailed
from apps.observability.models import LogLine
from apps.pipelines import services
from apps.pipelines.choices import RunStatus
from apps.pipelines.models import JournalEntry, Run
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from apps.secrets.services import SecretNotFound, secret_set
from tests.conftest import Worker, wait_for
from tests.harness.agents import AGENT_SRC
from tests.harness.embedded import graphenectl_argv
from tests.harness.web import WebServer

SECRET = "exec-token"
SECRET_VALUE = "s3cr3t-value-for-exec-only"


def graphenectl(web: WebServer, token: str, home: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHENE_")}
    env.update(web.client_env(), GRAPHENE_TOKEN=token, XDG_CONFIG_HOME=str(home), NO_COLOR="1")
    done = subprocess.run([*graphenectl_argv(), *args], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_a_pipeline_runs_commands_on_an_agent(
    web: WebServer, workers: list[Worker], operator: str, tmp_path: Path
) -> None:
    secret_set(name=SECRET, value=SECRET_VALUE)
    # The shared workers know the web server's URL (what install_env() writes).
    env_path = tmp_path / "agent.env"
    run = services.run_start(pipeline_name="sample.agent", inputs={"env_path": str(env_path), "secret": SECRET})
    wait_for(env_path.exists, timeout=60, what="the run to hand over the agent's install config")
    assert env_path.stat().st_mode & 0o777 == 0o600
    config = env_path.read_text()
    assert "GRAPHENE_AGENT_BOOTSTRAP_TOKEN=" in config
    with env_path.open("a") as fh:
        fh.write(f"GRAPHENE_AGENT_STATE_DIR={tmp_path / 'state'}\nGRAPHENE_AGENT_BACKOFF_MAX_SECONDS=1\n")

    # Before its agent is installed, the record waits: a note in its history, not an error.
    assert run.record_id is not None
    box = Record.objects.get(created_by_run_id=run.record_id, kind="agent")
    wait_for(
        lambda: Event.objects.filter(record=box, type=EventType.NOTE, reason="Waiting").exists(),
        timeout=30,
        what="the agent record to say it waits for its agent",
    )
    assert Record.objects.get(pk=box.pk).phase == Phase.CREATING

    agent = subprocess.Popen(
        [sys.executable, "-m", "graphene_agent", "--config", str(env_path)],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(AGENT_SRC), "HOME": str(tmp_path)},
        stdout=(tmp_path / "agent.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(lambda: Run.objects.get(pk=run.pk).status in {"succeeded", "failed"}, timeout=90, what="the run")
        run = Run.objects.get(pk=run.pk)
        assert run.status == RunStatus.SUCCEEDED, run.error + (tmp_path / "agent.log").read_text()[-2000:]
        digest = hashlib.sha256(SECRET_VALUE.encode()).hexdigest()
        assert run.outputs == {
            "exit_code": 3,
            "stdout": "out\n",
            "stderr": "err\n",
            "greeting": "hello from /tmp\n",
            "secret_digest": digest,
        }
        calls = list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("call", flat=True))
        assert calls == ["agent box", "step install", "exec agent/box sh", "exec agent/box sh", "exec agent/box sh"]
        assert "BOOTSTRAP" not in str(list(JournalEntry.objects.filter(run=run).values_list("result", flat=True)))

        # A normal install is no failure: the agent record's history holds no error.
        history = list(Event.objects.filter(record=box).order_by("id").values_list("type", "reason"))
        assert (EventType.ERROR, "CreateFailed") not in history, history
        assert not [h for h in history if h[0] == EventType.ERROR], history
        waits = [h for h in history if h == (EventType.NOTE, "Waiting")]
        assert len(waits) == 1, history  # told once, however often the record looked again

        # The run's log shows each line of its commands once (the agent's record is the run's).
        printed = json.loads(graphenectl(web, operator, tmp_path, "logs", f"run/{run.pk}", "-o", "json"))
        messages = [line["message"].strip() for line in printed if line["source"].startswith("command/")]
        assert sorted(messages) == sorted(["out", "err", "hello from /tmp", digest]), printed
        assert {line["record"] for line in printed if line["source"].startswith("command/")} == {str(box.pk)}

        # The secret's value reached the program, and is nowhere at rest but sealed in its command.
        third = AgentCommand.objects.filter(agent=box).order_by("created_at").last()
        assert third is not None
        assert set(third.payload) == {agents.SEALED, "argv", "secret_env"}
        assert third.payload["secret_env"] == ["TOKEN"]  # names, whose values its output masks
        stored = [
            *AgentCommand.objects.filter(agent=box).values_list("payload", "stdout_tail", "result"),
            *JournalEntry.objects.filter(run=run).values_list("call", "result", "error"),
            *LogLine.objects.values_list("message", flat=True),
            *Event.objects.values_list("message", "data"),
            *Record.objects.values_list("spec", "outputs"),
        ]
        assert SECRET_VALUE not in json.dumps(stored, default=str)

        wait_for(
            lambda: Record.objects.get(pk=box.pk).phase == Phase.DELETED, what="the agent record to die with the run"
        )
    finally:
        agent.kill()
        agent.wait(timeout=30)


@pytest.mark.django_db
def test_exec_env_secrets_are_read_for_pipelines_only_and_a_missing_one_is_named() -> None:
    from apps.records.services import record_create_root

    owner = record_create_root(kind="graphene.stand", name="exec-secrets")
    box = agents.agent_record_declare(owner=owner, name="box")
    payload = {"argv": ["true"], "env": {"TOKEN": {"$secret": "no-such-secret"}}}
    with pytest.raises(SecretNotFound, match="secret 'no-such-secret' does not exist"):
        agents.command_submit(agent=box, kind="exec", payload=payload, resolve_secrets=True)
    # Without resolve_secrets (the API's exec): a reference is not a string, and is refused.
    with pytest.raises(ValidationFailed, match=r"env\.TOKEN: must be a string"):
        agents.command_submit(agent=box, kind="exec", payload=payload)
    # Plain strings are not sealed: only a command that carries a secret's value is.
    plain = agents.command_submit(
        agent=box, kind="exec", payload={"argv": ["true"], "env": {"A": "b"}}, resolve_secrets=True
    )
    assert plain.payload["env"] == {"A": "b"}
    assert not AgentCommand.objects.filter(agent=box, payload__has_key=agents.SEALED).exists()
