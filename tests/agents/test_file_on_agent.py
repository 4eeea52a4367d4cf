"""Files on an agent's machine: written, observed, healed and removed through the agent, and
given up on (with an event) when the machine is gone for good (real agent, web, worker)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from apps.agents.models import Agent, AgentCommand
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Event, Record
from tests.agents.conftest import wait_phase
from tests.conftest import Worker, wait_for
from tests.harness.agents import AgentProcess

DEADLINE_SECONDS = 4
# Workers that give a lost machine's deletions up after DEADLINE_SECONDS (shared by this module).
pytestmark = [
    pytest.mark.system,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("file-on-agent"),  # one xdist process starts their workers
    pytest.mark.worker_env(GRAPHENE_AGENT_LOST_DELETE_DEADLINE_SECONDS=str(DEADLINE_SECONDS)),
]


@pytest.fixture
def worker(workers: list[Worker]) -> Worker:
    return workers[0]


def declare_file(agent: Record, path: Path, content: str, mode: int = 0o640) -> Record:
    return records.record_declare(
        kind="file",
        name=path.name,
        owner=agent,
        spec={"path": str(path), "content": content, "mode": mode, "agent": str(agent.pk)},
    )


def generation_ready(record: Record, generation: int) -> Record | None:
    fresh = Record.objects.get(pk=record.pk)
    return fresh if fresh.phase == Phase.READY and fresh.observed_generation == generation else None


def reasons(record: Record) -> list[str]:
    events = Event.objects.filter(record=record).order_by("created_at", "id")
    return [f"{e.reason}: {e.message}" if e.reason == "DeletionAbandoned" else e.reason for e in events]


def test_a_file_on_an_agents_machine_is_written_healed_and_removed(
    agents: Callable[..., tuple[Record, AgentProcess]], worker: Worker, tmp_path: Path
) -> None:
    agent, _process = agents("files")
    wait_phase(agent, Phase.READY)
    path = tmp_path / "machine" / "etc" / "app.conf"
    record = declare_file(agent, path, "port=80\n")

    ready = wait_phase(record, Phase.READY)
    assert path.read_text() == "port=80\n"
    assert path.stat().st_mode & 0o7777 == 0o640
    assert ready.outputs["path"] == str(path)
    assert ready.outputs["agent"] == str(agent.pk)
    assert ready.outputs["digest"].startswith("sha256:")
    assert ready.outputs["size"] == 8
    writes = AgentCommand.objects.filter(agent=agent, kind="call", waiting_record_id=record.pk)
    assert writes.count() == 1
    assert writes.get().consumed_at is not None

    # Changed behind Graphene's back: the observation (through the agent) finds it, heals it.
    path.write_text("port=8080\n")
    counts = records.records_observe(record_ids=[record.pk])
    assert counts["healing"] == 1, counts
    wait_for(lambda: Record.objects.get(pk=record.pk).heals == 1, timeout=30, what="the heal")
    assert wait_phase(record, Phase.READY).heals == 1
    assert path.read_text() == "port=80\n"
    drift = Event.objects.get(record=record, type="drift_detected")
    assert [c["field"] for c in drift.data["changes"]] == ["content"]

    # Deleting the agent deletes the file first, through the agent, then the agent.
    records.record_delete_request(record=agent)
    wait_phase(record, Phase.DELETED)
    wait_phase(agent, Phase.DELETED)
    assert not path.exists()
    assert not any(r.startswith("DeletionAbandoned") for r in reasons(record)), reasons(record)


def test_a_strangers_file_on_the_machine_is_never_adopted(
    agents: Callable[..., tuple[Record, AgentProcess]], worker: Worker, tmp_path: Path
) -> None:
    agent, _process = agents("stranger")
    wait_phase(agent, Phase.READY)
    path = tmp_path / "theirs.conf"
    path.write_text("not yours\n")
    record = declare_file(agent, path, "mine\n")
    failed = wait_phase(record, Phase.CREATE_FAILED)
    assert "belongs to no Graphene record" in failed.last_error
    assert path.read_text() == "not yours\n"
    relative = declare_file(agent, Path("relative.conf"), "x")
    assert "must be absolute" in wait_phase(relative, Phase.CREATE_FAILED).last_error
    records.record_delete_request(record=agent)
    wait_phase(agent, Phase.DELETED)
    assert path.read_text() == "not yours\n"  # removal never touches a file that is not ours


def test_deleting_waits_for_a_machine_that_comes_back(
    agents: Callable[..., tuple[Record, AgentProcess]], worker: Worker, tmp_path: Path
) -> None:
    agent, process = agents("returns")
    wait_phase(agent, Phase.READY)
    path = tmp_path / "back.conf"
    record = declare_file(agent, path, "x\n")
    wait_phase(record, Phase.READY)
    process.stop()
    wait_for(lambda: Agent.objects.get(pk=agent.pk).session is None, what="the disconnect")

    records.record_delete_request(record=agent)
    wait_phase(record, Phase.DELETING)
    wait_for(
        lambda: AgentCommand.objects.filter(waiting_record_id=record.pk, payload__args__0="remove").exists(),
        what="the removal to be queued for the machine",
    )
    assert path.exists()
    process.start()  # back within the deadline: the queued removal is delivered and done
    wait_phase(record, Phase.DELETED, timeout=DEADLINE_SECONDS + 20)
    wait_phase(agent, Phase.DELETED)
    assert not path.exists()
    assert not any(r.startswith("DeletionAbandoned") for r in reasons(record)), reasons(record)


def test_deleting_a_file_on_a_lost_machine_is_abandoned_after_the_deadline(
    agents: Callable[..., tuple[Record, AgentProcess]], worker: Worker, tmp_path: Path
) -> None:
    agent, process = agents("lost")
    wait_phase(agent, Phase.READY)
    path = tmp_path / "lost.conf"
    record = declare_file(agent, path, "x\n")
    wait_phase(record, Phase.READY)
    process.kill()  # the machine is gone for good

    records.record_delete_request(record=agent)
    wait_phase(record, Phase.DELETING)
    deleted = wait_phase(record, Phase.DELETED, timeout=DEADLINE_SECONDS + 30)
    wait_phase(agent, Phase.DELETED)
    abandoned = Event.objects.get(record=record, reason="DeletionAbandoned")
    assert str(path) in abandoned.message
    assert "away since" in abandoned.message
    assert abandoned.data["abandoned"] is True
    assert deleted.deleted_at is not None
    assert deleted.deleted_at >= abandoned.created_at
    requested = Record.objects.get(pk=record.pk).deletion_requested_at
    assert requested is not None
    waited = (abandoned.created_at - requested).total_seconds()
    assert waited >= DEADLINE_SECONDS - 0.5, waited
    assert path.exists()  # nothing could remove it: the event says what may be left
    # The removal that never got out is cancelled, not left queued for a machine that is gone.
    assert not AgentCommand.objects.filter(waiting_record_id=record.pk, status__in=["queued", "sent"]).exists()


def test_a_secret_file_on_the_machine_is_never_stored_in_the_clear(
    agents: Callable[..., tuple[Record, AgentProcess]], worker: Worker, tmp_path: Path, api: Any
) -> None:
    from apps.secrets.services import secret_create

    secret_create(name="db-password", value="hunter2-very-secret")
    agent, _process = agents("secrets")
    wait_phase(agent, Phase.READY)
    path = tmp_path / "db.pass"
    record = records.record_declare(
        kind="file",
        name="db.pass",
        owner=agent,
        spec={"path": str(path), "content": {"$secret": "db-password"}, "mode": 0o600, "agent": str(agent.pk)},
    )
    wait_phase(record, Phase.READY)
    assert path.read_text() == "hunter2-very-secret"
    command = AgentCommand.objects.get(waiting_record_id=record.pk, operation="write@1")
    assert set(command.payload) == {"$sealed", "name"}
    for stored in (command.payload, Record.objects.get(pk=record.pk).outputs, command.result):
        assert "hunter2" not in str(stored)
        assert "aHVudGVyMi" not in str(stored)
    shown = api.get(f"/api/v1/agents/{agent.pk}/commands/{command.pk}/")
    assert shown.status_code == 200, shown.content
    assert shown.json()["payload"]["$sealed"] == "<encrypted>"


def test_a_spec_changed_while_the_machine_was_away_is_what_ends_up_on_it(
    agents: Callable[..., tuple[Record, AgentProcess]], worker: Worker, tmp_path: Path
) -> None:
    agent, process = agents("away")
    wait_phase(agent, Phase.READY)
    process.stop()
    wait_for(lambda: Agent.objects.get(pk=agent.pk).session is None, what="the disconnect")
    path = tmp_path / "app.conf"
    record = declare_file(agent, path, "version=1\n")
    wait_for(
        lambda: AgentCommand.objects.filter(waiting_record_id=record.pk, operation="write@1").exists(),
        what="the first write to be queued for the machine",
    )
    records.record_declare(
        kind="file",
        name=path.name,
        owner=agent,
        spec={"path": str(path), "content": "version=2\n", "mode": 0o640, "agent": str(agent.pk)},
    )
    wait_for(
        lambda: AgentCommand.objects.filter(waiting_record_id=record.pk, operation="write@2").exists(),
        what="the second write to be queued",
    )
    process.start()
    ready = wait_for(
        lambda: Record.objects.filter(pk=record.pk, phase=Phase.READY, observed_generation=2).first(),
        timeout=60,
        what="the record to converge to its second spec",
    )
    assert ready is not None
    assert path.read_text() == "version=2\n"
    assert ready.outputs["digest"] == "sha256:" + hashlib.sha256(b"version=2\n").hexdigest()


def test_a_file_moved_off_the_machine_is_removed_there_first(
    agents: Callable[..., tuple[Record, AgentProcess]], worker: Worker, tmp_path: Path, settings: Any
) -> None:
    agent, _process = agents("mover")
    wait_phase(agent, Phase.READY)
    path = tmp_path / "machine" / "moving.conf"
    record = declare_file(agent, path, "x\n")
    wait_phase(record, Phase.READY)
    assert path.exists()

    moved = records.record_declare(
        kind="file", name=path.name, owner=agent, spec={"path": "moved/moving.conf", "content": "x\n"}
    )
    assert moved.pk == record.pk
    ready = wait_for(lambda: generation_ready(record, 2), timeout=60, what="the file made on the server")
    assert ready is not None
    assert not path.exists(), "removed from the machine"
    assert Path(ready.outputs["path"]).read_text() == "x\n"
    assert ready.moved_from is None
    note = Event.objects.get(record=record, reason="MovedAway")
    assert note.data == {
        "from": {"path": str(path), "agent": str(agent.pk)},
        "to": {"path": "moved/moving.conf", "agent": None},
    }
    assert not any(r.startswith("DeletionAbandoned") for r in reasons(record)), reasons(record)


def test_moving_off_a_lost_machine_is_given_up_after_the_deadline_then_done(
    agents: Callable[..., tuple[Record, AgentProcess]], worker: Worker, tmp_path: Path
) -> None:
    agent, process = agents("stranded")
    wait_phase(agent, Phase.READY)
    path = tmp_path / "stranded.conf"
    record = declare_file(agent, path, "x\n")
    wait_phase(record, Phase.READY)
    process.kill()  # the machine is gone for good
    wait_for(lambda: Agent.objects.get(pk=agent.pk).session is None, what="the disconnect")

    records.record_declare(kind="file", name=path.name, owner=agent, spec={"path": "rescued.conf", "content": "x\n"})
    ready = wait_for(
        lambda: generation_ready(record, 2),
        timeout=DEADLINE_SECONDS + 40,
        what="the file made on the server after the deadline",
    )
    assert ready is not None
    abandoned = Event.objects.get(record=record, reason="DeletionAbandoned")
    assert str(path) in abandoned.message
    assert path.exists(), "nothing could remove it; the event says what may be left"
    assert Path(ready.outputs["path"]).exists()
    assert Event.objects.filter(record=record, reason="MovedAway").exists()
