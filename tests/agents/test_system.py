"""The agent and the gateway as real processes: daphne on loopback, agents as subprocesses."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from websockets.exceptions import ConnectionClosed
from websockets.typing import Origin

from apps.agents import services
from apps.agents.choices import CommandStatus
from apps.agents.models import Agent, AgentCommand, AgentToken
from apps.core.errors import ValidationFailed
from apps.core.tls import fingerprint, tls_local_ensure
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from tests.agents.conftest import is_private, wait_command, wait_phase
from tests.conftest import wait_for
from tests.harness.agents import AgentProcess, listening_sockets
from tests.harness.net import http
from tests.harness.web import WebServer
from tests.harness.ws import open_ws

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

Agents = Callable[..., tuple[Record, AgentProcess]]


def refusals(record: Record) -> list[str]:
    return list(Event.objects.filter(record=record, type=EventType.ERROR).values_list("reason", flat=True))


def test_bootstrap_exchange_then_credential_and_no_listening_port(agents: Agents) -> None:
    record, agent = agents("alpha")
    record = wait_phase(record, Phase.READY)
    facts = record.outputs["facts"]
    assert facts["hostname"]
    assert facts["cpus"] >= 1
    assert facts["memory_bytes"] > 0
    assert facts["labels"] == {"suite": "agents"}
    assert facts["agent_version"]
    assert {"type": "Connected", "status": "True"}.items() <= record.conditions[0].items()
    credential = agent.state_dir / "credential"
    assert is_private(credential, 0o600)
    assert is_private(agent.state_dir, 0o700)
    assert json.loads(credential.read_text())["credential"].startswith("gac_")
    # Only digests are stored: neither the token nor the credential is in the database.
    assert not AgentToken.objects.filter(digest__startswith="ga").exists()
    assert listening_sockets(agent.pid) == []  # I8: it listens on no port

    # A restart connects with the stored credential (the token was used once).
    agent.kill()
    agent.start()
    wait_for(lambda: "connected as agent" in agent.output().split("exchanged")[-1].split("connecting to")[-1],
             what="the restarted agent to connect")  # fmt: skip
    credential_row = AgentToken.objects.get(agent=record, kind="credential")
    wait_for(lambda: AgentToken.objects.get(pk=credential_row.pk).last_used_at is not None, what="credential use")
    assert AgentToken.objects.get(agent=record, kind="bootstrap").used_at is not None


def test_an_agent_trusts_only_the_ca_it_was_installed_with(agents: Agents, web: WebServer, tmp_path: Path) -> None:
    # The install data carries the server's CA; an agent with it connects over wss.
    record, agent = agents("pinned")
    server_ca = services.agent_server_ca(server_url=web.url)
    assert f"GRAPHENE_AGENT_SERVER_CA={server_ca}" in agent.config.read_text()
    assert base64.b64decode(server_ca) == ssl.PEM_cert_to_DER_cert(web.ca_file.read_text())
    wait_phase(record, Phase.READY)
    assert f"trusting the CA it was installed with (SHA-256 {fingerprint(web.ca_file.read_text())})" in agent.output()

    # Installed with another CA (the server's was replaced, or something else answers there):
    # it refuses the server before sending a thing, says so, and keeps its token.
    other = tls_local_ensure(directory=tmp_path / "other-ca", hostnames=["127.0.0.1"])
    _, spare = agents("doubtful", run=False)
    impostor_ca = base64.b64encode(ssl.PEM_cert_to_DER_cert(other.ca_path.read_text())).decode()
    spare.config.write_text(spare.config.read_text().replace(server_ca, impostor_ca))
    spare.start()
    wait_for(lambda: "refusing the server at" in spare.output(), what="the agent to refuse the server")
    line = next(line for line in spare.output().splitlines() if "refusing the server at" in line)
    assert " ERROR " in line
    assert f"does not chain to the CA it was installed with (SHA-256 {other.ca_fingerprint})" in line
    assert "nothing was sent to it" in line
    doubtful = Record.objects.get(name="doubtful")
    assert not AgentToken.objects.filter(agent=doubtful, kind="credential").exists()
    assert AgentToken.objects.get(agent=doubtful, kind="bootstrap").used_at is None
    assert not (spare.state_dir / "credential").exists()


def test_a_used_bootstrap_token_is_refused(agents: Agents, tmp_path: Path) -> None:
    record, first = agents("bravo")
    wait_phase(record, Phase.READY)
    token = first.config.read_text().split("GRAPHENE_AGENT_BOOTSTRAP_TOKEN=")[1].split()[0]
    web_url = first.config.read_text().split("GRAPHENE_AGENT_SERVER=")[1].split()[0]
    server_ca = first.config.read_text().split("GRAPHENE_AGENT_SERVER_CA=")[1].split()[0]
    second = AgentProcess(
        tmp_path / "bravo-again", server_url=web_url, agent_id=record.pk, bootstrap_token=token, server_ca=server_ca
    )
    assert second.start().wait_exit() == 78
    assert "single-use" in second.output()
    wait_for(lambda: "BootstrapTokenReused" in refusals(record), what="the refusal event")
    assert not (second.state_dir / "credential").exists()


def _try(web: WebServer, first: dict[str, Any]) -> tuple[int | None, dict[str, Any]]:
    """Speak the protocol's first message by hand: the gateway's answer, and its close code."""
    with open_ws(f"{web.ws_url}/agents/connect", log=web.log, origin=Origin(web.url)) as ws:
        ws.send(json.dumps(first))
        try:
            answer: dict[str, Any] = json.loads(ws.recv(timeout=10))
        except ConnectionClosed:  # the close overtook the refusal message: its reason says the same
            return ws.close_code, {"type": "refused", "reason": ws.close_reason}
        if answer["type"] == "refused":
            with contextlib.suppress(ConnectionClosed):
                ws.recv(timeout=10)
        return ws.close_code, answer


def test_foreign_revoked_expired_credentials_are_refused_with_events(
    agents: Agents, web: WebServer, stand: Record
) -> None:
    a, agent_a = agents("charlie")
    b, _ = agents("delta", run=False)
    wait_phase(a, Phase.READY)
    stolen = json.loads((agent_a.state_dir / "credential").read_text())["credential"]

    code, answer = _try(web, {"type": "auth", "agent_id": str(b.pk), "credential": stolen})
    assert code == 4403
    assert "belongs to agent" in answer["reason"]
    assert "ForeignCredential" in refusals(b)
    assert "ForeignCredential" in refusals(a)

    code, _ = _try(web, {"type": "auth", "agent_id": str(b.pk), "credential": "gac_not-a-real-one"})
    assert code == 4401
    assert "UnknownCredential" in refusals(b)

    # Revocation closes the live connection, and the agent stops for good (exit status 78).
    services.agent_credentials_revoke(record=a, reason="test")
    assert agent_a.wait_exit() == 78
    assert "reconnecting in" not in agent_a.output()
    assert "the credential was revoked: test" in agent_a.output()
    code, answer = _try(web, {"type": "auth", "agent_id": str(a.pk), "credential": stolen})
    assert code == 4403
    assert "revoked" in answer["reason"]
    assert "CredentialRevoked" in refusals(a)

    # Expiry: enroll b by hand, then let its credential expire.
    install = services.agent_declare(owner=stand, name="delta")
    _, welcome = _try(web, {"type": "bootstrap", "agent_id": str(b.pk), "token": install.bootstrap_token})
    assert welcome["type"] == "welcome"
    assert welcome["credential"].startswith("gac_")
    AgentToken.objects.filter(agent=b, kind="credential", revoked_at__isnull=True).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    code, answer = _try(web, {"type": "auth", "agent_id": str(b.pk), "credential": welcome["credential"]})
    assert code == 4403
    assert "expired" in answer["reason"]
    assert "CredentialExpired" in refusals(b)


def test_a_credential_that_expires_while_connected_closes_the_connection(agents: Agents) -> None:
    """Expiry, like revocation, ends a live connection, not only the next connect: the agent is
    told why and stops for good (it needs a new enrollment), and the record says so."""
    record, agent = agents("echo-expiring")
    wait_phase(record, Phase.READY)
    agent.kill()
    soon = timezone.now() + timedelta(seconds=3)
    AgentToken.objects.filter(agent=record, kind="credential", revoked_at__isnull=True).update(expires_at=soon)
    agent.start()
    assert agent.wait_exit() == 78
    assert "the credential expired at" in agent.output()
    assert "reconnecting in" not in agent.output().split("connected as agent")[-1]
    assert "CredentialExpired" in refusals(record)
    assert timezone.now() >= soon


def test_exec_streams_output_and_returns_the_exit_code(agents: Agents, web: WebServer, operator: str) -> None:
    record, _ = agents("echo")
    wait_phase(record, Phase.READY)
    script = "for i in 1 2 3 4 5; do echo line$i; sleep 0.3; done; echo oops >&2; exit 3"
    status, body = http(
        "POST", f"{web.url}/api/v1/agents/{record.pk}/exec/", token=operator,
        body={"argv": ["sh", "-c", script], "env": {"GREETING": "hi"}, "cwd": "/tmp", "timeout": 30},
    )  # fmt: skip
    assert status == 202, body
    command = AgentCommand.objects.get(pk=body["id"])
    # Streamed: the first line is in the agent record's log while the command still runs.
    wait_for(
        lambda: record.log_lines.filter(source=f"command/{command.pk}", message="line1").exists(),
        what="the first line in the log",
    )
    assert AgentCommand.objects.get(pk=command.pk).status == CommandStatus.RUNNING
    done = wait_command(command)
    assert (done.status, done.exit_code) == (CommandStatus.FAILED, 3)
    assert done.stdout_tail == "line1\nline2\nline3\nline4\nline5\n"
    assert done.stderr_tail == "oops\n"
    lines = list(
        record.log_lines.filter(source=f"command/{command.pk}").order_by("id").values_list("stream", "message")
    )
    assert lines == [*(("stdout", f"line{i}") for i in range(1, 6)), ("stderr", "oops")]
    status, polled = http("GET", f"{web.url}/api/v1/agents/{record.pk}/commands/{command.pk}/", token=operator)
    assert status == 200
    assert polled["status"] == "failed"
    assert polled["exit_code"] == 3

    ok = services.command_submit(agent=record, kind="exec", payload={"argv": ["sh", "-c", "echo $GREETING"],
                                                                     "env": {"GREETING": "hello"}})  # fmt: skip
    done = wait_command(ok)
    assert (done.status, done.exit_code, done.stdout_tail) == (CommandStatus.SUCCEEDED, 0, "hello\n")


PROMPT = "import sys, time; sys.stdout.write('Password: '); sys.stdout.flush(); time.sleep(3); print('typed')"
# 256 KiB of whole lines, then half a line, a pause longer than a prompt's, and the rest.
BULK_THEN_PAUSE = (
    "import sys, time\n"
    "sys.stdout.write(''.join(f'{i:06d} bulk output line\\n' for i in range(11000)) + 'half of a li')\n"
    "sys.stdout.flush(); time.sleep(0.4); print('ne'); print('last')\n"
)


def command_lines(record: Record, command: AgentCommand) -> list[str]:
    lines = record.log_lines.filter(source=f"command/{command.pk}").order_by("id")
    return list(lines.values_list("message", flat=True))


def test_a_prompt_without_a_newline_is_stored_while_the_program_waits(agents: Agents) -> None:
    record, _ = agents("prompt")
    wait_phase(record, Phase.READY)
    command = services.command_submit(agent=record, kind="exec", payload={"argv": [sys.executable, "-c", PROMPT]})
    wait_for(lambda: command_lines(record, command) == ["Password: "], timeout=10, what="the prompt in the log")
    assert AgentCommand.objects.get(pk=command.pk).status == CommandStatus.RUNNING, "sent while it waits"
    assert wait_command(command).status == CommandStatus.SUCCEEDED
    assert command_lines(record, command) == ["Password: ", "typed"]


def test_a_line_a_bulk_writer_pauses_in_is_stored_whole(agents: Agents) -> None:
    """A producer stopped mid-line (a full pipe, a busy machine) while writing in bulk is no
    prompt: its line is kept whole across a pause longer than a prompt's."""
    record, _ = agents("bulk")
    wait_phase(record, Phase.READY)
    command = services.command_submit(
        agent=record, kind="exec", payload={"argv": [sys.executable, "-c", BULK_THEN_PAUSE]}
    )
    assert wait_command(command).status == CommandStatus.SUCCEEDED
    lines = command_lines(record, command)
    assert lines[-2:] == ["half of a line", "last"]
    assert lines[:-2] == [f"{i:06d} bulk output line" for i in range(11000)]


def test_files_put_and_get(agents: Agents, tmp_path: Path) -> None:
    import base64

    record, _ = agents("files")
    wait_phase(record, Phase.READY)
    target = tmp_path / "machine" / "etc" / "app.conf"
    put = services.command_submit(
        agent=record, kind="put_file",
        payload={"path": str(target), "data": base64.b64encode(b"key=value\n").decode(), "mode": 0o640},
    )  # fmt: skip
    assert wait_command(put).status == CommandStatus.SUCCEEDED
    assert target.read_bytes() == b"key=value\n"
    assert is_private(target, 0o640)
    get = wait_command(services.command_submit(agent=record, kind="get_file", payload={"path": str(target)}))
    assert base64.b64decode(get.result["data"]) == b"key=value\n"
    assert get.result["size"] == 10
    missing = wait_command(services.command_submit(agent=record, kind="get_file", payload={"path": "/nonexistent"}))
    assert missing.status == CommandStatus.FAILED
    assert "cannot read" in missing.error


CALL_LOOKS_AROUND = """
def look(secret):
    import glob, os, sys, tempfile
    found = []
    for directory in glob.glob(os.path.join(tempfile.gettempdir(), "graphene-call-*")):
        for name in os.listdir(directory):
            with open(os.path.join(directory, name), "rb") as fh:
                if secret.encode() in fh.read():
                    found.append(name)
    return {"files_with_the_secret": found, "stdin": sys.stdin.read(), "argv_has_it": secret in " ".join(sys.argv)}
"""


def test_a_call_gets_its_arguments_on_stdin_and_never_on_the_disk(agents: Agents) -> None:
    """A call's arguments may hold a token (a git checkout's auth): they reach the function
    through its interpreter's stdin, never a file or argv, and the function finds stdin ended."""
    record, _ = agents("calls")
    wait_phase(record, Phase.READY)
    secret = "tok-" + os.urandom(8).hex()
    done = wait_command(
        services.command_submit(
            agent=record, kind="call", payload={"name": "look", "source": CALL_LOOKS_AROUND, "args": [secret]}
        )
    )
    assert done.status == CommandStatus.SUCCEEDED, done.error
    assert done.result["value"] == {"files_with_the_secret": [], "stdin": "", "argv_has_it": False}


CALL_SAYS_WHERE = """
def where(fail=False, sleep=0):
    import os, sys, time
    time.sleep(sleep)
    if fail:
        raise LookupError("no such thing")
    return {"pid": os.getpid(), "argv0": sys.argv[0]}
"""


def test_the_servers_own_calls_run_in_the_agents_process_and_a_users_in_their_own(agents: Agents) -> None:
    """``in_process`` (the kinds' operations): no interpreter is started, the result and errors
    are a call's, the agent's own state is left alone; a timeout stops the wait, not the agent."""
    record, process = agents("in-process")
    wait_phase(record, Phase.READY)

    def call(in_process: bool, **kwargs: Any) -> AgentCommand:
        payload = {"name": "where", "source": CALL_SAYS_WHERE, "kwargs": kwargs, "timeout": 1}
        return wait_command(services.command_submit(agent=record, kind="call", payload=payload, in_process=in_process))

    here = call(True)
    assert here.status == CommandStatus.SUCCEEDED, here.error
    assert here.result["value"]["pid"] == process.pid, "called in the agent's own process"
    assert "agent.run" not in here.result["value"]["argv0"], "the agent's sys.argv is left alone"
    apart = call(False)
    assert apart.result["value"]["pid"] != process.pid
    assert apart.result["value"]["argv0"] == "<agent.run where>"

    failed = call(True, fail=True)
    assert failed.status == CommandStatus.FAILED
    assert (failed.result["error_type"], failed.result["error_message"]) == ("LookupError", "no such thing")
    assert "call_runner" not in failed.result["traceback"]
    assert 'raise LookupError("no such thing")' in failed.result["traceback"], "the function's own lines"

    slow = call(True, sleep=3)
    assert slow.status == CommandStatus.FAILED
    assert slow.result.get("timed_out") is True
    assert "did not return within 1s" in slow.error
    assert call(True).status == CommandStatus.SUCCEEDED, "the agent serves on"

    with pytest.raises(ValidationFailed) as refused:  # a user's payload cannot ask for it
        services.command_submit(
            agent=record, kind="call", payload={"name": "where", "source": CALL_SAYS_WHERE, "in_process": True}
        )
    assert "in_process" in str(refused.value.detail)
    with pytest.raises(ValidationFailed):
        services.command_submit(agent=record, kind="exec", payload={"argv": ["true"]}, in_process=True)


@pytest.mark.own_web  # it kills the server
def test_reconnect_with_backoff_delivers_a_queued_command_once(agents: Agents, web: WebServer, tmp_path: Path) -> None:
    record, agent = agents("resilient")
    wait_phase(record, Phase.READY)
    counter = tmp_path / "side-effects"
    web.kill()
    wait_for(lambda: agent.output().count("reconnecting in") >= 3, what="reconnect attempts with backoff")
    # Queued while the server is down: only a row, delivered when the agent is back.
    command = services.command_submit(
        agent=record, kind="exec", payload={"argv": ["sh", "-c", f"echo ran >> {counter}"]}
    )
    web.start()
    done = wait_command(command)
    assert done.status == CommandStatus.SUCCEEDED
    assert counter.read_text() == "ran\n"
    delays = [float(line.split("reconnecting in ")[1].split("s")[0]) for line in agent.output().splitlines()
              if "reconnecting in" in line]  # fmt: skip
    assert max(delays) <= 1.5
    assert len(delays) >= 3

    # The server "loses" the result (as if it died before storing it) and re-sends the command
    # after the next reconnect: the agent answers from its journal instead of running it again.
    AgentCommand.objects.filter(pk=command.pk).update(status=CommandStatus.SENT, exit_code=None)
    web.kill()
    web.start()
    replayed = wait_command(command)
    assert replayed.status == CommandStatus.SUCCEEDED
    # Delivered again, yet one side effect: the agent answered from its journal (or re-reported
    # the stored result first, when its report of the first run raced the re-delivery).
    assert replayed.deliveries >= 2
    assert counter.read_text() == "ran\n"


def _pid_from(path: Path) -> int:
    return int(wait_for(lambda: path.exists() and path.read_text().strip(), what=f"{path}"))


def test_at_most_once_command_of_a_vanished_agent_is_unknown(agents: Agents, tmp_path: Path, settings: Any) -> None:
    record, agent = agents("fragile")
    wait_phase(record, Phase.READY)
    marker = tmp_path / "started"
    command = services.command_submit(
        agent=record, kind="exec", guarantee="at_most_once",
        payload={"argv": ["sh", "-c", f"echo $$ >> {marker}; exec sleep 60"]},
    )  # fmt: skip
    wait_for(lambda: AgentCommand.objects.get(pk=command.pk).status == CommandStatus.RUNNING, what="running")
    pid = _pid_from(marker)
    agent.kill()  # mid-flight; then the command's own process dies with the machine
    os.kill(pid, signal.SIGKILL)
    agent.start()  # same state: the journal says "started, no result"
    done = wait_command(command)
    assert done.status == CommandStatus.UNKNOWN
    assert "outcome is unknown" in done.error
    assert len(marker.read_text().split()) == 1  # never run a second time

    # An agent that never comes back: after the grace period, in-flight at-most-once is unknown.
    second = services.command_submit(
        agent=record, kind="exec", guarantee="at_most_once",
        payload={"argv": ["sh", "-c", f"echo $$ > {tmp_path / 'second'}; exec sleep 60"]},
    )  # fmt: skip
    wait_for(lambda: AgentCommand.objects.get(pk=second.pk).status == CommandStatus.RUNNING, what="running")
    os.kill(_pid_from(tmp_path / "second"), signal.SIGKILL)
    agent.kill()
    wait_for(lambda: Agent.objects.get(pk=record.pk).session is None, what="the disconnect")
    settings.GRAPHENE_AGENT_DISCONNECT_GRACE_SECONDS = 0
    assert services.agents_mark_lost() == 1
    assert AgentCommand.objects.get(pk=second.pk).status == CommandStatus.UNKNOWN
    assert Record.objects.get(pk=record.pk).phase == Phase.DRIFTED
    agent.start()
    wait_phase(record, Phase.READY)  # back: ready again


def test_cancel_and_timeout_kill_the_process_group(
    agents: Agents, web: WebServer, operator: str, tmp_path: Path
) -> None:
    record, _ = agents("killable")
    wait_phase(record, Phase.READY)
    pidfile = tmp_path / "pid"
    command = services.command_submit(
        agent=record, kind="exec", payload={"argv": ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"]}
    )
    child = _pid_from(pidfile)
    status, body = http("POST", f"{web.url}/api/v1/agents/{record.pk}/commands/{command.pk}/cancel/", token=operator)
    assert status == 202, body
    done = wait_command(command)
    assert done.status == CommandStatus.CANCELLED
    wait_for(lambda: not Path(f"/proc/{child}").exists(), timeout=10, what="the grandchild to be killed")

    slow = wait_command(
        services.command_submit(agent=record, kind="exec", payload={"argv": ["sleep", "30"], "timeout": 0.5})
    )
    assert slow.status == CommandStatus.FAILED
    assert slow.result.get("timed_out") is True
    assert "timed out" in slow.error


def test_the_zipapp_installs_with_the_install_script_on_python_39(
    web: WebServer, stand: Record, tmp_path: Path
) -> None:
    status, body = http("GET", f"{web.url}/agents/download?sha256")
    assert status == 200
    sha = body.decode().split()[0]
    install = services.agent_declare(owner=stand, name="from-script", server_url=web.url)
    assert sha in install.install_script
    assert install.bootstrap_token in install.install_script
    python = Path("/root/.pyenv/versions/3.9.18/bin/python")
    python = python if python.exists() else Path("/usr/bin/python3")
    script = tmp_path / "install.sh"
    script.write_text(install.install_script)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "GRAPHENE_AGENT_PREFIX": str(tmp_path / "opt"),
        "GRAPHENE_AGENT_CONF_DIR": str(tmp_path / "etc"),
        "GRAPHENE_AGENT_STATE_DIR": str(tmp_path / "var"),
        "GRAPHENE_AGENT_PYTHON": str(python),
        "GRAPHENE_AGENT_NO_SYSTEMD": "1",
    }
    result = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    pid = int((tmp_path / "var" / "agent.pid").read_text())
    try:
        record = wait_phase(install.record, Phase.READY)
        assert record.outputs["facts"]["python"].startswith("3.9." if "3.9" in str(python) else "3.")
        assert is_private(tmp_path / "etc" / "agent.env", 0o600)
        assert listening_sockets(pid) == []
        pyz = tmp_path / "opt" / "graphene-agent.pyz"
        clean = subprocess.run([str(python), "-I", "-S", str(pyz), "--version"], env={}, capture_output=True, text=True)
        assert clean.returncode == 0
        assert clean.stdout.startswith("graphene-agent ")
    finally:
        os.kill(pid, signal.SIGTERM)


def test_the_agent_refuses_a_config_file_others_can_read(tmp_path: Path) -> None:
    config = tmp_path / "agent.env"
    config.write_text("GRAPHENE_AGENT_SERVER=http://127.0.0.1:9\nGRAPHENE_AGENT_ID=" + "0" * 32 + "\n")
    config.chmod(0o644)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "agent")}
    result = subprocess.run([sys.executable, "-m", "graphene_agent", "--config", str(config)], env=env,
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert result.returncode == 2
    assert "chmod 600" in result.stderr


def test_the_agent_refuses_a_server_ca_that_is_not_a_certificate(tmp_path: Path) -> None:
    config = tmp_path / "agent.env"
    config.write_text(
        "GRAPHENE_AGENT_SERVER=https://127.0.0.1:9\nGRAPHENE_AGENT_ID="
        + "0" * 32
        + "\nGRAPHENE_AGENT_SERVER_CA=bm90IGEgY2VydA==\n"
    )
    config.chmod(0o600)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "agent")}
    result = subprocess.run([sys.executable, "-m", "graphene_agent", "--config", str(config)], env=env,
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert result.returncode == 2
    assert "GRAPHENE_AGENT_SERVER_CA does not hold a certificate" in result.stderr


@pytest.mark.own_web  # it kills the server
def test_output_streamed_across_a_server_restart_has_no_gaps_or_duplicates(agents: Agents, web: WebServer) -> None:
    record, agent = agents("streamer")
    wait_phase(record, Phase.READY)
    command = services.command_submit(
        agent=record, kind="exec",
        payload={"argv": ["sh", "-c", "i=1; while [ $i -le 80 ]; do echo n$i; i=$((i+1)); sleep 0.05; done"]},
    )  # fmt: skip
    source = f"command/{command.pk}"
    wait_for(lambda: record.log_lines.filter(source=source).count() >= 10, what="some output")
    web.kill()
    # Output keeps coming while the server is down: the agent holds it, trying to reconnect.
    down = agent.output().count("reconnecting in")
    wait_for(lambda: agent.output().count("reconnecting in") > down, what="the agent to miss the server")
    web.start()
    done = wait_command(command)
    assert done.status == CommandStatus.SUCCEEDED
    assert done.deliveries >= 2
    lines = list(record.log_lines.filter(source=source).order_by("id").values_list("message", flat=True))
    assert lines == [f"n{i}" for i in range(1, 81)]
    assert "connected as agent" in agent.output()
