"""graphenectl against the shared web server (daphne, PostgreSQL) and workers: what a user of
each command relies on, from the console script's stdout, stderr and exit code.

Runs of ``sample.cli`` (tests/pipelines/sample.py): a record owning another, log lines, an
optional durable pause, an optional failure of the program's own exception class.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.db import transaction

from apps.agents.models import AgentToken
from apps.observability.models import LogLine
from apps.pipelines import services
from apps.pipelines.choices import TERMINAL
from apps.pipelines.models import Run
from apps.records.choices import Phase
from apps.records.models import Event, Record
from tests.conftest import Worker, wait_for
from tests.factories import api_token
from tests.harness.embedded import Ctl, Result, graphenectl_argv
from tests.harness.processes import WITH_DEFAULT_SIGINT
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture
def admin_token(django_user_model: Any) -> str:
    user = django_user_model.objects.create_superuser(username="root", password="pw")
    return api_token(user)


@pytest.fixture
def ctl(web: WebServer, admin_token: str, tmp_path: Path) -> Ctl:
    """graphenectl for the shared web server (GRAPHENE_SERVER and GRAPHENE_TOKEN, no context)."""
    return Ctl(tmp_path / "config", **web.client_env(), GRAPHENE_TOKEN=admin_token)


def start(ctl: Ctl, **inputs: Any) -> str:
    args = [item for key, value in inputs.items() for item in ("-i", f"{key}={value}")]
    run: dict[str, Any] = ctl.ok("run", "start", "sample.cli", *args, "-o", "json").json()
    return str(run["id"])


def ended(run_id: str, timeout: float = 60) -> Run:
    wait_for(lambda: Run.objects.get(pk=run_id).status in TERMINAL, timeout=timeout, what=f"run {run_id} to end")
    return Run.objects.get(pk=run_id)


def stderr_lines(result: Result) -> list[str]:
    return [line for line in result.err.splitlines() if line.strip()]


# --- reading ---------------------------------------------------------------------------------


def test_get_stands_pipeline_lists_what_the_stand_holds(ctl: Ctl) -> None:
    held = ctl.ok("apply", "test.sleep", "held", "--owner", "stand/sample.cli").out.strip()
    table = ctl.ok("get", "stands", "sample.cli")
    assert "Traceback" not in table.err
    header, row = table.out.splitlines()[:2]
    assert header.split()[:4] == ["ID", "KIND", "NAME", "PHASE"]
    assert row.split()[:3] == [held.removeprefix("record/"), "test.sleep", "held"]
    assert ctl.ok("get", "stands", "sample.cli", "-o", "name").out.split() == [held]
    assert "held" in ctl.ok("get", "stands", "sample.cli", "-o", "wide").out
    assert [h["name"] for h in ctl.ok("get", "stands", "sample.cli", "-o", "json").json()["holdings"]] == ["held"]


def test_child_runs_are_found_from_their_parent(ctl: Ctl) -> None:
    parent = services.run_start(pipeline_name="sample.wait", inputs={})
    with transaction.atomic():  # as the engine starts them, with the parent's journal entry
        children = services.run_start_children(
            parent=parent, pipeline_name="sample.child", inputs=[{"index": 0}, {"index": 1}], concurrency=1, group=1
        )
    services.run_start(pipeline_name="sample.child", inputs={"index": 7})  # another run, no child
    listed = ctl.ok("run", "list", "--parent", f"run/{parent.pk}", "-o", "json").json()
    assert sorted(r["id"] for r in listed) == sorted(str(c.pk) for c in children)
    assert ctl.ok("get", "runs", "--parent", str(parent.pk), "-o", "name").out.split() == [
        f"run/{c.pk}" for c in reversed(children)
    ]
    described = ctl.ok("describe", f"run/{children[0].pk}").out
    assert f"run/{parent.pk} (sample.wait#{parent.number})" in described
    about_parent = ctl.ok("describe", f"run/{parent.pk}").out
    assert "Child runs (2):" in about_parent
    tree = ctl.ok("tree", f"run/{parent.pk}").out
    for child in children:
        assert f"child run sample.child#{child.number}" in tree, tree
        assert f"run/{child.pk}" in tree
    assert tree.index(f"sample.child#{children[0].number}") < tree.index(f"sample.child#{children[1].number}")
    refused = ctl("get", "records", "--parent", str(parent.pk))
    assert refused.code == 2
    assert "--parent filters runs" in refused.err


def test_describe_a_run_shows_its_status_and_what_it_waits_on(ctl: Ctl, workers: list[Worker]) -> None:
    sleeping = start(ctl, hold_seconds=600)
    wait_for(lambda: Run.objects.get(pk=sleeping).status == "suspended" and Run.objects.get(pk=sleeping).wake_at)
    for ref in (sleeping, f"run/{sleeping}"):  # a bare run id is its root record's id too
        described = ctl.ok("describe", ref).out
        assert "Phase:" not in described, described
        status = next(line for line in described.splitlines() if line.startswith("Status:"))
        assert "suspended: sleeping until" in status, status
    # The run's root record says whose it is.
    assert f"run/{sleeping} is suspended" in ctl.ok("describe", f"record/{sleeping}").out

    # A record that takes a while to create (the worker creating it is busy meanwhile).
    waiting = ctl.ok("run", "start", "sample.wait", "-i", "create_ms=12000", "-o", "json").json()["id"]
    wait_for(lambda: Run.objects.get(pk=waiting).status == "suspended")
    described = ctl.ok("describe", waiting).out
    assert "Status:     suspended: waiting on test.flaky/thing (creating)" in described, described
    assert "Waiting on: test.flaky/thing (creating)" in described
    for run_id in (sleeping, waiting):
        ctl.ok("run", "cancel", run_id)


def test_trace_lines_are_whole_in_a_pipe(ctl: Ctl, workers: list[Worker]) -> None:
    run_id = start(ctl, lines=0)
    assert ended(run_id).status == "succeeded"
    lines = ctl.ok("trace", run_id, env={"COLUMNS": "80"}).out.splitlines()
    assert any(len(line) > 80 for line in lines), lines
    spans = ctl.ok("trace", run_id, "-o", "json").json()
    with_records: list[dict[str, Any]] = []
    pending = [spans["root"]]
    while pending:
        span = pending.pop()
        pending.extend(span.get("children", []))
        if span.get("record"):
            with_records.append(span)
    assert with_records
    text = "\n".join(lines)
    for span in with_records:
        assert f"record/{span['record']}" in text  # each id whole, never cut


# --- changing records ------------------------------------------------------------------------


def test_apply_says_created_configured_or_unchanged(ctl: Ctl, web: WebServer, admin_token: str) -> None:
    owner = ctl.ok("apply", "graphene.stand", f"apply-{uuid.uuid4().hex[:8]}").out.strip()
    first = ctl.ok("apply", "test.sleep", "box", "--owner", owner, "--spec", "-", stdin="create_ms: 10")
    assert "created" in first.err
    rid = first.out.strip().removeprefix("record/")

    same = ctl.ok("apply", "test.sleep", "box", "--owner", owner, "--spec", "-", stdin="create_ms: 10")
    assert same.out.strip() == f"record/{rid}"
    assert "unchanged" in same.err
    assert "configured" not in same.err

    changed = ctl.ok("apply", "test.sleep", "box", "--owner", owner, "--spec", "-", stdin="create_ms: 20")
    assert Record.objects.get(pk=rid).generation == 2
    assert "configured (generation 2)" in changed.err, changed.err
    assert "unchanged" not in changed.err

    labelled = ctl.ok("apply", "test.sleep", "box", "--owner", owner, "-l", "a=b", "--spec", "-", stdin="create_ms: 20")
    assert "configured (generation 3)" in labelled.err, labelled.err


# --- following a run to its end --------------------------------------------------------------


def test_logs_and_events_follow_a_run_until_it_ends(ctl: Ctl, workers: list[Worker]) -> None:
    failing = start(ctl, hold_seconds=1, fail="true")
    logs = ctl("logs", f"run/{failing}", "-f", "--interval", "0.3")
    assert logs.code == 4, logs  # as `run watch`: the run failed
    printed = [line for line in logs.out.splitlines() if "from the run" in line]
    assert [line.rsplit("] ", 1)[-1] for line in printed] == ["line 0 from the run", "line 1 from the run"]
    # Its final status is the last word (then a hint): what it raised, by class, not module path.
    number = Run.objects.get(pk=failing).number
    last = stderr_lines(logs)
    assert last[-2] == f"graphenectl: error: run sample.cli #{number} failed: CliRefused: the smoke test said no"
    assert "tests.pipelines.sample.CliRefused" not in logs.err

    events = ctl("events", failing, "-f", "-o", "json", "--interval", "0.3")
    assert events.code == 4, events
    assert next(json.loads(line)["type"] for line in events.out.splitlines()) == "declared"

    succeeding = start(ctl, hold_seconds=1)
    followed = ctl("logs", f"run/{succeeding}", "-f", "-o", "json", "--interval", "0.3")
    assert followed.code == 0, followed
    messages = [json.loads(line)["message"] for line in followed.out.splitlines()]
    assert messages.count("line 0 from the run") == 1
    assert messages.count("line 1 from the run") == 1
    assert "succeeded" in stderr_lines(followed)[-1]
    assert Run.objects.get(pk=succeeding).status == "succeeded", "it ended because the run had"


def test_follow_without_a_run_goes_on_until_ctrl_c(ctl: Ctl) -> None:
    owner = ctl.ok("apply", "graphene.stand", f"follow-{uuid.uuid4().hex[:8]}").out.strip()
    follower = subprocess.Popen(
        # SIGINT at its default, as in a terminal, even when this test run inherited it ignored.
        [*WITH_DEFAULT_SIGINT, *graphenectl_argv(), "events", owner, "-f", "-o", "json", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ctl.env(),
    )
    try:
        assert follower.stdout is not None
        assert json.loads(follower.stdout.readline())["type"] == "declared"
        assert follower.poll() is None, "a record has no end: -f follows it until Ctrl-C"
    finally:
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=10) == 0


# --- run watch in a CI log -------------------------------------------------------------------


def test_run_watch_in_a_log_shows_log_text_names_and_the_outcome(ctl: Ctl, workers: list[Worker]) -> None:
    run_id = start(ctl, lines=3, fail="true")
    watched = ctl("run", "watch", run_id, "--interval", "0.3")
    assert watched.code == 4, watched
    lines = stderr_lines(watched)
    text = "\n".join(lines)
    for i in range(3):
        assert f"line {i} from the run" in text  # the log's text, not "call N log: completed"
    assert not re.search(r"call \d+ log\b", text), text
    assert "declare test.sleep/inner under test.sleep/box" in text, text
    calls = [line for line in lines if line.strip().startswith("call ")]
    assert calls
    assert not [line for line in calls if UUID.search(line)], calls  # owners by kind/name
    # It ends with the outcome: the run's status, its error, then one line with what it raised;
    # no progress line ("3/3 ready") after the status.
    status_at = max(i for i, line in enumerate(lines) if line.startswith("run sample.cli #"))
    assert lines[status_at].endswith("failed"), lines[status_at]
    assert not [line for line in lines[status_at:] if re.match(r"\s*\d+/\d+ ready", line)]
    number = Run.objects.get(pk=run_id).number
    assert lines[-2] == f"graphenectl: error: run sample.cli #{number} failed: CliRefused: the smoke test said no"
    assert lines[-1].strip().startswith(f"hint: graphenectl logs run/{run_id}")
    assert "tests.pipelines.sample." not in text  # errors name classes, not module paths


# --- help ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        (),
        ("get",),
        ("logs",),
        ("run", "start"),
        ("run", "watch"),
        ("pipeline", "push"),
        ("pipeline", "revisions"),
        ("apply",),
        ("agent", "create"),
        ("namespace", "create"),
        ("role", "create"),
        ("role", "bind"),
        ("secret", "set"),
        ("source", "apply"),
        ("source", "sync"),
        ("ctx", "set-namespace"),
    ],
)
def test_help_shows_no_python_types(tmp_path: Path, command: tuple[str, ...]) -> None:
    shown = Ctl(tmp_path).ok(*command, "--help").out  # help needs no server
    for python_type in ("<bool>", "<str>", "<int", "<float", "<list["):
        assert python_type not in shown, (command, shown)
    help_line = next(line for line in shown.splitlines() if "Show this message and exit." in line)
    assert re.search(r"--help\s+-h\s+Show this message", help_line), help_line  # a flag: no value


# --- agent create ----------------------------------------------------------------------------


def install(script: str, tmp_path: Path) -> int:
    """Run an install script as a user would on a machine; the agent's pid."""
    path = tmp_path / "install.sh"
    path.write_text(script)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "GRAPHENE_AGENT_PREFIX": str(tmp_path / "opt"),
        "GRAPHENE_AGENT_CONF_DIR": str(tmp_path / "etc"),
        "GRAPHENE_AGENT_STATE_DIR": str(tmp_path / "var"),
        "GRAPHENE_AGENT_NO_SYSTEMD": "1",
    }
    done = subprocess.run(["sh", str(path)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int((tmp_path / "var" / "agent.pid").read_text())


def token_in(text: str) -> str:
    found = re.search(r"GRAPHENE_AGENT_BOOTSTRAP_TOKEN=(\S+)", text)
    assert found, text
    return found.group(1)


def test_agent_create_prints_install_data_that_enrolls_the_machine(
    ctl: Ctl, web: WebServer, tmp_path: Path, django_user_model: Any
) -> None:
    created = ctl.ok("agent", "create", "builder-1", "-l", "pool=ci")
    token = token_in(created.out)
    assert created.out.startswith("#!/bin/sh")
    assert token not in created.err, "only stdout carries the token"
    assert "builder-1" in created.err
    assert "created" in created.err
    record = Record.objects.get(kind="agent", name="builder-1")
    assert record.labels == {"pool": "ci"}
    assert record.parent is not None
    assert (record.parent.kind, record.parent.name) == ("graphene.stand", "agents")

    pid = install(created.out, tmp_path)
    try:
        wait_for(lambda: Record.objects.get(pk=record.pk).phase == Phase.READY, what="the installed agent to connect")
        listed = ctl.ok("get", "agents", "-l", "pool=ci", "-o", "json").json()
        assert [(a["name"], a["connected"]) for a in listed] == [("builder-1", True)]
    finally:
        os.kill(pid, signal.SIGTERM)

    # Again, as cloud-init user data: the same agent, a fresh token, the script in write_files.
    again = ctl.ok("agent", "create", "builder-1", "--cloud-init")
    assert again.out.startswith("#cloud-config\n")
    document = yaml.safe_load(again.out)
    script = document["write_files"][0]["content"]
    assert script.startswith("#!/bin/sh")
    assert f"GRAPHENE_AGENT_ID={record.pk}" in script
    assert document["write_files"][0]["permissions"] == "0700"
    assert document["runcmd"][0][:2] == ["sh", "-c"]
    second = token_in(script)
    assert second != token
    assert "exists" in again.err
    assert Record.objects.filter(kind="agent", name="builder-1").count() == 1

    # The tokens are nowhere but in what was printed: digests in the database, no event, no
    # log line, nothing in the server's log.
    stored = [
        *Event.objects.values_list("message", "data"),
        *LogLine.objects.values_list("message", flat=True),
        *AgentToken.objects.values_list("digest", "prefix"),
    ]
    for secret in (token, second):
        assert secret not in json.dumps(stored, default=str)
        assert secret not in web.log.read_text(errors="replace")

    # Refusals: a label that is not k=v (2, nothing sent), an unknown owner (3), no permission (1).
    assert ctl("agent", "create", "x", "-l", "oops").code == 2
    assert ctl("agent", "create", "x", "--owner", str(uuid.uuid4())).code == 3
    plain = django_user_model.objects.create_user(username="plain", password="pw")
    refused = ctl("agent", "create", "x", env={"GRAPHENE_TOKEN": api_token(plain)})
    assert refused.code == 1
    assert "may not create agents" in refused.err
    assert not Record.objects.filter(kind="agent", name="x").exists()


def test_agent_create_under_an_owner(ctl: Ctl) -> None:
    owner = ctl.ok("apply", "graphene.stand", f"machines-{uuid.uuid4().hex[:8]}").out.strip().removeprefix("record/")
    ctl.ok("agent", "create", "m1", "--owner", owner)
    assert str(Record.objects.get(kind="agent", name="m1").parent_id) == owner
