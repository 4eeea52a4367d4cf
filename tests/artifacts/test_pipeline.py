"""Artifacts in real runs (worker processes): one run publishes, a later run attaches, reads
and copies it into a file; replays store nothing twice and the journal holds references only."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.utils import timezone

from apps.artifacts import blobs
from apps.pipelines import services
from apps.pipelines.choices import TERMINAL, RunStatus
from apps.pipelines.models import JournalEntry, Run
from apps.records.choices import Phase
from apps.records.models import Record
from tests.artifacts import pipelines  # noqa: F401 - registers the pipelines in this process
from tests.conftest import Worker, wait_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def finished(run: Run) -> Run:
    wait_for(lambda: Run.objects.get(pk=run.pk).status in TERMINAL, timeout=120, what=f"run {run} to end")
    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.SUCCEEDED, run.error
    return run


def test_a_run_publishes_an_artifact_and_a_later_run_uses_it(workers: list[Worker], tmp_path: Path) -> None:
    text = f"build output {timezone.now().isoformat()}\n"

    published = finished(services.run_start(pipeline_name="artifacts.publish", inputs={"text": text}))
    assert published.outputs is not None
    artifact = Record.objects.get(pk=published.outputs["id"])
    assert published.outputs["read_back"] == text
    assert (artifact.kind, artifact.spec["name"], artifact.name) == ("artifact", "dist/app.txt", "dist/app.txt@run-1")
    assert artifact.parent is not None
    assert artifact.parent.kind == "graphene.stand", "kept on the stand"
    assert artifact.parent.name == "artifacts.publish"
    assert artifact.created_by_run_id == published.pk
    assert artifact.expires_at is not None
    assert artifact.expires_at > timezone.now()
    wait_for(lambda: Record.objects.get(pk=artifact.pk).phase == Phase.READY, what="the artifact to be ready")
    assert blobs.read_bytes(artifact.spec["sha256"]) == text.encode()
    # The run was replayed after its sleep: still one record, and the journal holds references only.
    assert Record.objects.filter(kind="artifact", created_by_run_id=published.pk).count() == 1
    entries = list(JournalEntry.objects.filter(run=published, call__startswith="publish_artifact").order_by("seq"))
    assert [(e.result or {}).get("id") for e in entries] == [str(artifact.pk)] * 2
    assert text not in str([e.result for e in JournalEntry.objects.filter(run=published)])
    run_root = published.record_id
    assert run_root is not None
    wait_for(lambda: Record.objects.get(pk=run_root).phase == Phase.DELETED, what="the run's tree to go")
    assert Record.objects.get(pk=artifact.pk).phase == Phase.READY, "the artifact outlives its run"

    used = finished(services.run_start(pipeline_name="artifacts.use", inputs={"path": "use/app.txt"}))
    assert used.outputs is not None
    assert used.outputs["id"] == str(artifact.pk)
    assert used.outputs["content"] == text
    assert used.outputs["file"]["digest"] == f"sha256:{artifact.spec['sha256']}"
    assert used.outputs["on_disk"] == text, "the file held the artifact's bytes"
    written = Path(used.outputs["file"]["path"])
    wait_for(lambda: not written.exists(), what="the file to go with its run")

    # A second publishing run: attach finds the newest; the same bytes are stored once.
    again = finished(services.run_start(pipeline_name="artifacts.publish", inputs={"text": text}))
    assert again.outputs is not None
    assert again.outputs["id"] != str(artifact.pk)
    assert Record.objects.get(pk=again.outputs["id"]).name == "dist/app.txt@run-2"
    assert [p.name for p in (blobs.root() / "sha256").rglob("*") if p.is_file()].count(artifact.spec["sha256"]) == 1
    newest = finished(services.run_start(pipeline_name="artifacts.use", inputs={"path": "use/app2.txt"}))
    assert newest.outputs is not None
    assert newest.outputs["id"] == again.outputs["id"]

    # A file of the worker, streamed; then attaching a name nobody published fails the run, saying so.
    source = tmp_path / "big.bin"
    source.write_bytes(b"\xfe\xff" * (blobs.CHUNK + 3))  # no NUL: outputs are jsonb
    from_file = finished(
        services.run_start(pipeline_name="artifacts.publish", inputs={"name": "big.bin", "from_path": str(source)})
    )
    assert from_file.outputs is not None
    assert from_file.outputs["size"] == source.stat().st_size
    missing = services.run_start(pipeline_name="artifacts.use", inputs={"name": "nope.txt"})
    wait_for(lambda: Run.objects.get(pk=missing.pk).status in TERMINAL, timeout=120, what="the run to end")
    failed = Run.objects.get(pk=missing.pk)
    assert failed.status == RunStatus.FAILED
    assert "cannot attach artifact 'nope.txt' on the stand of 'artifacts.publish'" in failed.error
