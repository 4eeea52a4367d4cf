"""``ctx.agent_via_ssh``: an agent installed over SSH (real sshd on loopback) with a pinned host
key and a private key from the secret store; the install converges; the key never leaks."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from apps.agents.models import AgentToken
from apps.agents.services import agent_record_declare
from apps.agents.ssh_install import HostKeyMismatch, SSHInstallError, SSHTarget, agent_ssh_install
from apps.observability.models import LogLine
from apps.observability.selectors import log_lines
from apps.pipelines import services as pipelines
from apps.pipelines.choices import TERMINAL, RunStatus
from apps.pipelines.models import JournalEntry, Run
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from apps.secrets.services import secret_set
from tests.agents import ssh_pipelines  # noqa: F401 - registers agents.ssh in this process
from tests.agents.sshd import SSHServer, ed25519_keypair
from tests.conftest import Worker, wait_for
from tests.harness.net import free_port
from tests.harness.web import WebServer

PIPELINE_MODULES = "tests.pipelines.sample,tests.agents.ssh_pipelines"
KEY_SECRET = "deploy-key"
NOWHERE = "http://127.0.0.1:9"  # an agent pointed here keeps retrying: a live process to count


def openssh_fingerprint(public_line: str) -> str:
    """SHA256 fingerprint as ``ssh-keygen -l`` prints it, computed independently of the product."""
    blob = base64.b64decode(public_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def target(sshd: SSHServer, *, host_key: str | None = None, key_secret: str = KEY_SECRET) -> SSHTarget:
    return SSHTarget(
        host=sshd.host,
        port=sshd.port,
        user=sshd.user,
        key_secret=key_secret,
        host_key=host_key or sshd.host_key.public_line,
    )


def key_fragments(private_key: str) -> list[str]:
    """The body lines of the private key that are its own (any of them found anywhere is a leak).

    Lines every key of the format shares (the "openssh-key-v1, no cipher" header) are left out.
    """
    common = set(ed25519_keypair().private_openssh.splitlines())
    fragments = [line for line in private_key.splitlines() if len(line) > 20 and line not in common]
    assert fragments
    return fragments


def tables_containing(needle: str) -> list[str]:
    """Every table of the database with a row whose text contains ``needle``."""
    hits = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f'SELECT count(*) FROM "{table}" AS t WHERE strpos(t::text, %s) > 0', [needle])  # noqa: S608
            if cursor.fetchone()[0]:
                hits.append(table)
    return hits


def files_containing(needle: str, *roots: Path) -> list[Path]:
    found = []
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            if path.is_file() and needle.encode() in path.read_bytes():
                found.append(path)
    return found


# --- the install itself (service level, against the real sshd) -------------------------------


@pytest.mark.django_db
def test_the_install_converges_and_never_starts_a_second_agent(sshd: SSHServer, stand: Record) -> None:
    secret_set(name=KEY_SECRET, value=sshd.user_key.private_openssh)
    record = agent_record_declare(owner=stand, name="m1")

    first = agent_ssh_install(record=record, target=target(sshd), server_url=NOWHERE)
    assert first.changed
    assert first.method == "background"  # no systemd here: a new session with a pid file
    assert first.pid is not None
    assert sshd.agent_processes() == [first.pid]
    directory = sshd.home / ".graphene-agent" / str(record.pk)
    assert Path(first.directory) == directory
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "agent.env").stat().st_mode) == 0o600
    assert (directory / "agent.pid").read_text().strip() == str(first.pid)
    assert f"GRAPHENE_AGENT_ID={record.pk}" in (directory / "agent.env").read_text()
    tokens = AgentToken.objects.filter(agent=record).count()

    # Again (a replay after a crash, a second run of the step): it finds the agent running.
    again = agent_ssh_install(record=record, target=target(sshd), server_url=NOWHERE)
    assert not again.changed
    assert again.pid == first.pid
    assert sshd.agent_processes() == [first.pid]
    assert AgentToken.objects.filter(agent=record).count() == tokens  # no new bootstrap token either

    # An agent that died (a reboot, a kill) is started again, once; the stale pid file is not trusted.
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: sshd.agent_processes() == [], what="the killed agent to be gone")
    restarted = agent_ssh_install(record=record, target=target(sshd), server_url=NOWHERE)
    assert restarted.changed
    assert restarted.pid not in (None, first.pid)
    assert sshd.agent_processes() == [restarted.pid]

    # Changed settings (another server address) replace the running agent: still exactly one.
    moved = agent_ssh_install(record=record, target=target(sshd), server_url="http://127.0.0.1:10")
    assert moved.changed
    assert sshd.agent_processes() == [moved.pid]
    assert "GRAPHENE_AGENT_SERVER=http://127.0.0.1:10" in (directory / "agent.env").read_text()


@pytest.mark.django_db
def test_a_wrong_host_key_is_refused_before_anything_is_sent(sshd: SSHServer, stand: Record) -> None:
    secret_set(name=KEY_SECRET, value=sshd.user_key.private_openssh)
    record = agent_record_declare(owner=stand, name="m1")
    impostor = ed25519_keypair()
    before = sshd.connections()

    with pytest.raises(HostKeyMismatch) as refused:
        agent_ssh_install(record=record, target=target(sshd, host_key=impostor.public_line), server_url=NOWHERE)

    message = str(refused.value)
    assert f"host key mismatch for 127.0.0.1:{sshd.port}" in message
    assert f"expected ssh-ed25519 {openssh_fingerprint(impostor.public_line)}" in message
    assert f"presented ssh-ed25519 {openssh_fingerprint(sshd.host_key.public_line)}" in message
    assert not (sshd.home / ".graphene-agent").exists()
    assert "Accepted publickey" not in sshd.log.read_text()  # it never even authenticated
    assert sshd.connections() == before + 1
    assert not AgentToken.objects.filter(agent=record).exists()


@pytest.mark.django_db
def test_a_refused_key_and_a_missing_secret_are_named(sshd: SSHServer, stand: Record) -> None:
    record = agent_record_declare(owner=stand, name="m1")
    with pytest.raises(SSHInstallError) as missing:
        agent_ssh_install(record=record, target=target(sshd, key_secret="no-such-key"), server_url=NOWHERE)
    assert "secret 'no-such-key' does not exist" in str(missing.value)
    assert "POST /api/v1/secrets/" in str(missing.value)
    assert not missing.value.transient

    secret_set(name="stranger", value=ed25519_keypair().private_openssh)
    with pytest.raises(SSHInstallError) as refused:
        agent_ssh_install(record=record, target=target(sshd, key_secret="stranger"), server_url=NOWHERE)
    assert f"{sshd.user}@127.0.0.1:{sshd.port} refused the key from secret 'stranger'" in str(refused.value)
    assert not refused.value.transient

    secret_set(name="not-a-key", value="hunter2")
    with pytest.raises(SSHInstallError, match="secret 'not-a-key' does not hold a private key"):
        agent_ssh_install(record=record, target=target(sshd, key_secret="not-a-key"), server_url=NOWHERE)
    assert not (sshd.home / ".graphene-agent").exists()


# --- from a pipeline (real worker, web server, agent) ---------------------------------------


def start_run(sshd: SSHServer, *, host_key: str | None = None, port: int | None = None) -> Run:
    inputs = {
        "host": sshd.host,
        "port": port or sshd.port,
        "user": sshd.user,
        "key": KEY_SECRET,
        "host_key": host_key or sshd.host_key.public_line,
    }
    return pipelines.run_start(pipeline_name="agents.ssh", inputs=inputs)


def wait_run(run: Run, timeout: float = 180) -> Run:
    def ended() -> Run | None:
        fresh = Run.objects.get(pk=run.pk)
        return fresh if fresh.status in TERMINAL else None

    fresh = wait_for(ended, timeout=timeout, what=f"run {run.pk} to end")
    assert fresh is not None
    return fresh


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_a_run_installs_an_agent_over_ssh_that_connects_and_runs_commands(
    web: WebServer, sshd: SSHServer, workers: list[Worker], tmp_path: Path
) -> None:
    # The shared workers know the web server's URL (what the installed agent dials).
    secret_set(name=KEY_SECRET, value=sshd.user_key.private_openssh)
    connections = sshd.connections()

    run = wait_run(start_run(sshd))

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.outputs == {"exit_code": 0, "home": str(sshd.home)}
    calls = list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("call", flat=True))
    assert calls == [
        "agent_via_ssh box",
        "declare test.sleep/uses-the-key",
        "log",
        "exec agent/box true",
        "exec agent/box sh",
    ]
    entry = JournalEntry.objects.get(run=run, seq=1)
    assert entry.status == "completed"
    assert entry.result is not None
    assert run.record_id is not None
    box = Record.objects.get(created_by_run_id=run.record_id, kind="agent", name="box")
    assert entry.result["record_id"] == str(box.pk)
    # The run suspended and replayed several times (waiting for the agent, for each command):
    # one SSH session installed the agent, and replays returned the journaled result.
    assert sshd.connections() == connections + 1
    run_log = log_lines(record=Record.objects.get(pk=run.record_id))  # its agent's lines are its own
    installed = run_log.filter(source="ssh-install").values_list("message", flat=True)
    assert len(installed) == 1
    assert f"installed over SSH on {sshd.user}@127.0.0.1:{sshd.port}" in installed[0]
    assert openssh_fingerprint(sshd.host_key.public_line) in installed[0]
    # The spec and the log line hold the secret's name only.
    uses = Record.objects.get(created_by_run_id=run.record_id, name="uses-the-key")
    assert uses.spec == {"value": {"key": {"$secret": KEY_SECRET}}}
    assert LogLine.objects.filter(record_id=run.record_id, message=f"installed with SecretRef(name='{KEY_SECRET}')")

    # The private key is nowhere: not in any table (journal, events, logs, specs, outputs,
    # the secret store's own row), not in any process's log, not on the machine.
    for fragment in key_fragments(sshd.user_key.private_openssh):
        assert tables_containing(fragment) == [], fragment
        assert files_containing(fragment, tmp_path, sshd.home, web.log, *(w.log for w in workers)) == [], fragment

    # The agent dies with its record: the run ended, the record was deleted, the agent was
    # told so and exited for good (nothing restarts it).
    wait_for(lambda: Record.objects.get(pk=box.pk).phase == Phase.DELETED, what="the agent record to be deleted")
    wait_for(lambda: sshd.agent_processes() == [], timeout=60, what="the installed agent to exit")


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_a_run_with_a_wrong_host_key_fails_with_the_mismatch_and_sends_nothing(
    sshd: SSHServer, start_worker: Callable[..., Worker], monkeypatch: Any
) -> None:
    monkeypatch.setenv("GRAPHENE_PIPELINE_MODULES", PIPELINE_MODULES)
    monkeypatch.setenv("GRAPHENE_AGENT_SSH_ATTEMPTS", "3")
    secret_set(name=KEY_SECRET, value=sshd.user_key.private_openssh)
    start_worker()
    impostor = ed25519_keypair()
    connections = sshd.connections()

    unreachable = start_run(sshd, port=free_port())  # nothing listens there
    run = wait_run(start_run(sshd, host_key=impostor.public_line))

    assert run.status == RunStatus.FAILED
    assert f"host key mismatch for 127.0.0.1:{sshd.port}" in run.error
    assert f"expected ssh-ed25519 {openssh_fingerprint(impostor.public_line)}" in run.error
    assert f"presented ssh-ed25519 {openssh_fingerprint(sshd.host_key.public_line)}" in run.error
    entry = JournalEntry.objects.get(run=run, seq=1)
    assert (entry.call, entry.status) == ("agent_via_ssh box", "failed")
    assert sshd.connections() == connections + 1  # not retried
    assert "Accepted publickey" not in sshd.log.read_text()
    assert not (sshd.home / ".graphene-agent").exists()

    # An unreachable host is worth a few more tries (durable timers), then the call fails.
    unreachable = wait_run(unreachable)
    assert unreachable.status == RunStatus.FAILED
    assert f"cannot install agent/box over SSH (after 3 attempts): cannot reach {sshd.user}@127.0.0.1:" in (
        unreachable.error
    )
    assert unreachable.attempt >= 3  # it was suspended between the attempts, not blocked in one


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
@pytest.mark.own_web  # it kills the server
def test_a_run_waits_for_an_agent_that_cannot_connect_yet_and_resumes_when_it_connects(
    web: WebServer, sshd: SSHServer, start_worker: Callable[..., Worker], monkeypatch: Any, tmp_path: Path
) -> None:
    monkeypatch.setenv("GRAPHENE_AGENT_SERVER_URL", web.url)
    monkeypatch.setenv("GRAPHENE_PIPELINE_MODULES", PIPELINE_MODULES)
    # Waiting for an agent to connect is no failed attempt: even with a single create attempt
    # allowed, the agent record waits (creating, a Waiting note) while the run waits for it.
    monkeypatch.setenv("GRAPHENE_CREATE_ATTEMPTS", "1")
    secret_set(name=KEY_SECRET, value=sshd.user_key.private_openssh)
    web.kill()  # the installed agent cannot connect for now
    start_worker()

    run = start_run(sshd)

    box = wait_for(
        lambda: Record.objects.filter(created_by_run_id=run.record_id, name="box").first(),
        timeout=60,
        what="the agent record",
    )
    assert box is not None
    wait_for(
        lambda: Event.objects.filter(record=box, type=EventType.NOTE, reason="Waiting").exists(),
        timeout=60,
        what="the agent record to say it waits for its agent",
    )
    wait_for(sshd.agent_processes, timeout=60, what="the agent to be installed and running")
    wait_for(lambda: Run.objects.get(pk=run.pk).status == RunStatus.SUSPENDED, what="the run to wait")
    assert Record.objects.get(pk=box.pk).phase == Phase.CREATING
    # The web server comes back at the same address: the agent reconnects and says hello.
    (tmp_path / "again").mkdir()
    again = WebServer(tmp_path / "again")
    again.port, again.url = web.port, web.url
    again.start()
    try:
        run = wait_run(run)
    finally:
        again.kill()

    assert run.status == RunStatus.SUCCEEDED, run.error
    phases = [
        event["data"]["to"]
        for event in Record.objects.get(pk=box.pk).events.filter(type="phase_changed").order_by("id").values("data")
    ]
    assert phases[:2] == [Phase.CREATING, Phase.READY]
    assert not Event.objects.filter(record=box, type=EventType.ERROR).exists(), "waiting is not an error"
    # It waited suspended, woken by the hello, not by going round in circles.
    assert run.attempt < 15, run.attempt
