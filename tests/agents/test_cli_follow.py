"""graphenectl follows an agent command's output as the agent streams it."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apps.agents.models import AgentCommand
from apps.records.choices import Phase
from tests.agents.conftest import wait_command, wait_phase
from tests.conftest import interrupt, read_lines_until
from tests.harness.embedded import graphenectl_argv
from tests.harness.net import http
from tests.harness.processes import WITH_DEFAULT_SIGINT
from tests.harness.web import WebServer


def test_logs_follow_prints_command_output_while_it_runs(
    agents: Callable[..., tuple[Any, Any]], web: WebServer, operator: str, tmp_path: Path
) -> None:
    record, _ = agents("follow")
    wait_phase(record, Phase.READY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHENE_")}
    env.update(web.client_env(), GRAPHENE_TOKEN=operator, XDG_CONFIG_HOME=str(tmp_path), NO_COLOR="1")
    follower = subprocess.Popen(
        [*WITH_DEFAULT_SIGINT, *graphenectl_argv(), "logs", str(record.pk), "-f", "-o", "json", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        # The follower is polling once it has printed a first command's line (graphenectl may
        # take seconds to start on a loaded machine): only then does the timed one begin.
        status, body = http(
            "POST", f"{web.url}/api/v1/agents/{record.pk}/exec/", token=operator, body={"argv": ["echo", "ready"]}
        )
        assert status == 202, body
        read_lines_until(follower, lambda line: json.loads(line)["message"] == "ready", timeout=30)
        script = "for i in 1 2 3 4 5 6; do echo step$i; sleep 0.5; done"
        status, body = http(
            "POST", f"{web.url}/api/v1/agents/{record.pk}/exec/", token=operator, body={"argv": ["sh", "-c", script]}
        )
        assert status == 202, body
        command = AgentCommand.objects.get(pk=body["id"])
        first = read_lines_until(follower, lambda line: json.loads(line)["message"] == "step1", timeout=30)
        assert AgentCommand.objects.get(pk=command.pk).finished_at is None, "printed while the command still runs"
        rest = read_lines_until(follower, lambda line: json.loads(line)["message"] == "step6", timeout=30)
    finally:
        assert interrupt(follower) == 0
    printed = [json.loads(line) for line in first + rest]
    ours = [line["message"] for line in printed if line["source"] == f"command/{command.pk}"]
    assert ours == [f"step{i}" for i in range(1, 7)], "each line once, in order"
    assert wait_command(command).exit_code == 0
