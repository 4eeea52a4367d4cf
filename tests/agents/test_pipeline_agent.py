"""A pipeline acts on a machine through an agent: declare, install, exec (real processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from apps.observability.models import LogLine
from apps.pipelines import services
from apps.pipelines.choices import RunStatus
from apps.pipelines.models import JournalEntry, Run
from apps.records.choices import Phase
from apps.records.models import Record
from tests.conftest import Worker, wait_for
from tests.harness.agents import AGENT_SRC
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_a_pipeline_runs_commands_on_an_agent(web: WebServer, workers: list[Worker], tmp_path: Path) -> None:
    # The shared workers know the web server's URL (what install_env() writes).
    env_path = tmp_path / "agent.env"
    run = services.run_start(pipeline_name="sample.agent", inputs={"env_path": str(env_path)})
    wait_for(env_path.exists, timeout=60, what="the run to hand over the agent's install config")
    assert env_path.stat().st_mode & 0o777 == 0o600
    config = env_path.read_text()
    assert "GRAPHENE_AGENT_BOOTSTRAP_TOKEN=" in config
    with env_path.open("a") as fh:
        fh.write(f"GRAPHENE_AGENT_STATE_DIR={tmp_path / 'state'}\nGRAPHENE_AGENT_BACKOFF_MAX_SECONDS=1\n")
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
        assert run.outputs == {"exit_code": 3, "stdout": "out\n", "stderr": "err\n", "greeting": "hello from /tmp\n"}
        calls = list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("call", flat=True))
        assert calls == ["agent box", "step install", "exec agent/box sh", "exec agent/box sh"]
        assert "BOOTSTRAP" not in str(list(JournalEntry.objects.filter(run=run).values_list("result", flat=True)))
        assert run.record_id is not None
        logged = set(LogLine.objects.filter(record_id=run.record_id).values_list("message", flat=True))
        assert {"out", "err"} <= {m.strip() for m in logged}, logged
        box = Record.objects.get(created_by_run_id=run.record_id, kind="agent")
        wait_for(
            lambda: Record.objects.get(pk=box.pk).phase == Phase.DELETED, what="the agent record to die with the run"
        )
    finally:
        agent.kill()
        agent.wait(timeout=30)
