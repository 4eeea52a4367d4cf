"""Fixtures of the agent tests: agents as real processes dialling the web server (``web``, from
tests/conftest.py), an operator's token, a real sshd; waits on records and commands."""

from __future__ import annotations

import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.authtoken.models import Token

from apps.agents import services
from apps.agents.models import AgentCommand
from apps.records.models import Record
from tests import factories
from tests.agents.sshd import SSHServer
from tests.harness.agents import AgentProcess
from tests.harness.wait import wait_for
from tests.harness.web import WebServer


def wait_phase(record: Record, phase: str, timeout: float = 30) -> Record:
    def reached() -> Record | None:
        fresh = Record.objects.get(pk=record.pk)
        return fresh if fresh.phase == phase else None

    fresh = wait_for(reached, timeout=timeout, what=f"{record} to be {phase}")
    assert fresh is not None
    return fresh


def wait_command(command: AgentCommand, timeout: float = 30) -> AgentCommand:
    def finished() -> AgentCommand | None:
        fresh = AgentCommand.objects.get(pk=command.pk)
        return fresh if fresh.is_finished else None

    fresh = wait_for(finished, timeout=timeout, what=f"command {command.pk} to finish")
    assert fresh is not None
    return fresh


def is_private(path: Path, mode: int) -> bool:
    return stat.S_IMODE(path.stat().st_mode) == mode


@pytest.fixture
def stand() -> Record:
    from apps.records.services import record_create_root

    return record_create_root(kind="graphene.stand", name=f"agents-{time.monotonic_ns()}")


@pytest.fixture
def agents(web: WebServer, stand: Record, tmp_path: Path) -> Iterator[Callable[..., tuple[Record, AgentProcess]]]:
    """Declare an agent record and start a real agent process with its bootstrap token."""
    started: list[AgentProcess] = []

    def start(name: str, *, run: bool = True, command: list[str] | None = None) -> tuple[Record, AgentProcess]:
        install = services.agent_declare(owner=stand, name=name, labels={"suite": "agents"}, server_url=web.url)
        process = AgentProcess(
            tmp_path / name,
            server_url=web.url,
            agent_id=install.record.pk,
            bootstrap_token=install.bootstrap_token,
            command=command,
            server_ca=services.agent_server_ca(server_url=web.url),
        )
        started.append(process)
        if run:
            process.start()
        return install.record, process

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def operator(django_user_model: Any) -> str:
    """An API token of a user allowed to run commands on agents."""
    user = django_user_model.objects.create_user(username="operator", password="pw")
    factories.bind(user, "developer")
    return Token.objects.create(user=user).key


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SSHServer]:
    """A real OpenSSH server on loopback; agents installed through it are killed at the end."""
    server = SSHServer(tmp_path / "sshd").start()
    yield server
    server.stop()
