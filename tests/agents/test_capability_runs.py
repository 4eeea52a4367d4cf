"""Runs that find machines by name and by capability, and act on them without owning them
(real worker, web server and agent)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from apps.agents.models import AgentCapability
from apps.pipelines import services
from apps.pipelines.choices import TERMINAL, RunStatus
from apps.pipelines.models import JournalEntry, Run
from apps.records.choices import Phase
from apps.records.models import Event, Record
from tests.agents import capability_pipelines
from tests.agents.conftest import wait_phase
from tests.conftest import Worker, wait_for
from tests.harness.agents import AgentProcess
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def worker(web: WebServer, workers: list[Worker]) -> Worker:
    return workers[0]


def finished(run: Run, timeout: float = 90) -> Run:
    wait_for(lambda: Run.objects.get(pk=run.pk).status in TERMINAL, timeout=timeout, what=f"run {run.pk}")
    return Run.objects.get(pk=run.pk)


def test_a_run_attaches_publishes_selects_and_leaves_the_machine_alone(
    agents: Callable[..., tuple[Record, AgentProcess]], worker: Worker, tmp_path: Path
) -> None:
    box, _process = agents("builder")
    wait_phase(box, Phase.READY)
    folder = tmp_path / "attached"
    run = finished(
        services.run_start(pipeline_name="agents.capabilities", inputs={"name": "builder", "folder": str(folder)})
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    out = capability_pipelines.FindOutput.model_validate(run.outputs)
    assert out.hostname == socket.gethostname()
    assert out.selected == ["builder"]
    assert out.unmet == []
    assert out.file_digest.startswith("sha256:")

    python = AgentCapability.objects.get(agent=box, name="python")
    assert python.labels == {"impl": "cpython"}
    assert python.version.count(".") == 1
    assert str(python.published_by) == str(run.record_id)
    assert Event.objects.filter(record=box, reason="CapabilityPublished").count() == 1
    calls = list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("call", flat=True))
    assert calls[:5] == [
        "attach_agent builder",
        "call agent/builder python_version",
        "publish_capability agent/builder python",
        "attach_agent builder",
        "select_agents",
    ]
    # The file was the run's (on a machine it does not own): removed when the run ended; the
    # machine itself stays, ready, with what was published on it.
    note = Record.objects.get(kind="file", created_by_run_id=run.record_id)
    assert note.parent_id == run.record_id
    wait_phase(note, Phase.DELETED)
    assert not (folder / "note.txt").exists()
    assert Record.objects.get(pk=box.pk).phase == Phase.READY


def test_unmet_needs_fail_the_run_saying_what_the_machine_offers(
    agents: Callable[..., tuple[Record, AgentProcess]], worker: Worker
) -> None:
    from apps.agents.services import capability_publish

    box, _process = agents("plain")
    capability_publish(agent=box, name="gpu", version="1", labels={"vendor": "amd"})
    run = finished(services.run_start(pipeline_name="agents.capabilities.unmet", inputs={"name": "plain"}))
    assert run.status == RunStatus.FAILED
    assert "cannot attach agent plain: it needs gpu (vendor=nvidia): it publishes gpu with vendor=amd" in run.error
    missing = finished(services.run_start(pipeline_name="agents.capabilities.unmet", inputs={"name": "nobody"}))
    assert "no live agent has that name or id" in missing.error
