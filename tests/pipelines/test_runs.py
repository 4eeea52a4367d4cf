"""Durable runs: replay, suspend, cancel, crash, divergence.

Promises about processes (parallel convergence, a released worker, a killed worker, a cancel
while a step runs) are tested on real worker processes; the engine's semantics (divergence,
durable timers, retries, replay of a refused declaration, what the journal refuses) with the
in-process driver (``drive``), which runs the same tasks in the test's process.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.pipelines import services
from apps.pipelines.choices import EntryStatus, RunStatus
from apps.pipelines.models import JournalEntry, Run
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from kinds.testing import objects_of
from tests.conftest import Worker, wait_for
from tests.harness.driver import Driver
from tests.pipelines.sample import effect_count, effects_file

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def start(name: str, **inputs: Any) -> Run:
    return services.run_start(pipeline_name=name, inputs=inputs)


def status(run: Run) -> str:
    return Run.objects.get(pk=run.pk).status


def ended(run: Run) -> bool:
    return status(run) in {"succeeded", "failed", "cancelled", "timed_out"}


def finished(run: Run, timeout: float = 60) -> Run:
    wait_for(lambda: ended(run), timeout=timeout, what=f"{run} to end")
    return Run.objects.get(pk=run.pk)


def driven(drive: Driver, run: Run, timeout: float = 60) -> Run:
    """``finished``, with the run's tasks executed in this process by the driver."""
    drive.run_until(lambda: ended(run), timeout=timeout, what=f"{run} to end")
    return Run.objects.get(pk=run.pk)


def tree_records(run: Run) -> list[Record]:
    assert run.record_id is not None
    root = Record.objects.get(pk=run.record_id)
    return list(Record.objects.filter(tree_id=root.tree_id))


def all_deleted(run: Run) -> bool:
    return all(r.phase == Phase.DELETED for r in tree_records(run))


def test_a_run_converges_in_parallel_succeeds_and_cleans_up(workers: list[Worker]) -> None:
    run = start("sample.tree", branches=3, leaves=2, create_ms=300)
    run = finished(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.outputs == {"records": 9, "steps": ["branch-0", "branch-1", "branch-2"]}
    wait_for(lambda: all_deleted(run), timeout=30, what="the run's tree to be deleted")
    declared = [r for r in tree_records(run) if r.kind == "test.sleep"]
    assert len(declared) == 9
    assert all(objects_of(str(r.pk)) == [] for r in declared)
    calls = list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("call", flat=True))
    assert calls[:3] == ["declare test.sleep/branch-0", "declare test.sleep/branch-1", "declare test.sleep/branch-2"]
    assert "step use-branch-2" in calls
    # Declarations converge in parallel: creates of different records overlap in time. (Only
    # the branches are waited on; a leaf may still be creating when the run ends and dies.)
    became_ready = Event.objects.filter(type=EventType.PHASE_CHANGED, data__to=Phase.READY).values("record_id")
    spans = [_creating_span(r) for r in declared if r.pk in {e["record_id"] for e in became_ready}]
    assert len(spans) >= 3
    assert any(a0 < b1 and b0 < a1 for i, (a0, a1) in enumerate(spans) for b0, b1 in spans[i + 1 :]), spans


def _creating_span(record: Record) -> tuple[Any, Any]:
    events = Event.objects.filter(record=record, type=EventType.PHASE_CHANGED)
    began = events.get(data__to=Phase.CREATING).created_at
    ended = events.get(data__to=Phase.READY).created_at
    return began, ended


def test_waiting_releases_the_worker(start_worker: Callable[..., Worker]) -> None:
    start_worker("solo", concurrency=1)
    runs = [start("sample.wait", create_ms=2500) for _ in range(3)]
    # One pool process, three runs each waiting 2.5 s on a record: all three are suspended at
    # the same time, which is only possible if waiting does not hold the process.
    wait_for(lambda: all(status(r) == RunStatus.SUSPENDED for r in runs), timeout=20, what="all three suspended")
    for run in runs:
        assert finished(run).status == RunStatus.SUCCEEDED
        assert (Run.objects.get(pk=run.pk).outputs or {})["ok"] is True


def test_resource_failure_reaches_the_pipeline(drive: Driver) -> None:
    run = driven(drive, start("sample.wait", failures=1))
    assert run.status == RunStatus.SUCCEEDED
    outputs = run.outputs or {}
    assert outputs["ok"] is False
    assert "injected create failure" in outputs["error"]


def test_cancel_during_convergence_deletes_everything(workers: list[Worker]) -> None:
    run = start("sample.tree", branches=2, leaves=3, create_ms=4000)
    wait_for(
        lambda: Record.objects.filter(created_by_run_id=run.record_id, phase=Phase.CREATING).exists(), what="creating"
    )
    services.run_cancel(run=run)
    assert status(run) == RunStatus.CANCELLED
    wait_for(lambda: all_deleted(run), timeout=60, what="everything the run owned to be deleted")
    declared = [r for r in tree_records(run) if r.kind == "test.sleep"]
    assert declared
    assert all(objects_of(str(r.pk)) == [] for r in declared), "no external object survives the cancel"


def test_cancel_during_an_at_most_once_step_gives_outcome_unknown_on_resume(workers: list[Worker]) -> None:
    run = start("sample.step", guarantee="at_most_once", seconds=3, catch_unknown=True)
    wait_for(lambda: effect_count(str(run.pk), "act-started") == 1, what="the step to start")
    services.run_cancel(run=run)
    assert finished(run).status == RunStatus.CANCELLED
    services.run_resume(run=Run.objects.get(pk=run.pk))
    run = finished(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert effect_count(str(run.pk), "outcome-unknown") == 1
    assert effect_count(str(run.pk), "act-started") == 1, "an at-most-once step never runs twice"
    entry = JournalEntry.objects.get(run=run, call="step act")
    assert entry.status == EntryStatus.UNKNOWN


def test_uncaught_outcome_unknown_fails_the_run(workers: list[Worker]) -> None:
    run = start("sample.step", guarantee="at_most_once", seconds=3)
    wait_for(lambda: effect_count(str(run.pk), "act-started") == 1, what="the step to start")
    services.run_cancel(run=run)
    services.run_resume(run=Run.objects.get(pk=run.pk))
    run = finished(run)
    assert run.status == RunStatus.FAILED
    assert "OutcomeUnknown" in run.error
    assert "'act'" in run.error


def test_a_worker_killed_mid_step_is_resumed_elsewhere_without_recreating(start_worker: Callable[..., Worker]) -> None:
    doomed = start_worker("doomed", concurrency=1)
    run = start("sample.tree", branches=2, leaves=1, step_ms=3000)
    wait_for(lambda: effect_count(str(run.pk), "work-branch-0") == 0 and _step_running(run), what="a step to run")
    declared_before = {r.pk for r in tree_records(run) if r.kind == "test.sleep"}
    doomed.kill()
    start_worker("survivor")
    # The beat's body: the dead worker's lease expires and the run is queued again.
    wait_for(
        lambda: services.runs_recover()["lease_expired"] or status(run) != RunStatus.RUNNING,
        timeout=30,
        what="lease recovery",
    )
    run = finished(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    declared_after = {r.pk for r in tree_records(run) if r.kind == "test.sleep"}
    assert declared_after == declared_before, "replay re-created nothing"
    assert len(declared_after) == 4
    assert run.attempt >= 2


def _step_running(run: Run) -> bool:
    return status(run) == RunStatus.RUNNING and JournalEntry.objects.filter(run=run, call__startswith="ready").exists()


def test_divergence_fails_naming_the_call(drive: Driver) -> None:
    run = start("sample.diverge")
    drive.run_until(lambda: status(run) == RunStatus.SUSPENDED, what="the run to sleep")
    effects_file(str(run.pk), "flag").write_text("changed")
    services.run_resume(run=Run.objects.get(pk=run.pk))
    run = driven(drive, run)
    assert run.status == RunStatus.FAILED
    assert "call #2" in run.error
    assert "'step renamed'" in run.error
    assert "'step second'" in run.error
    assert effect_count(str(run.pk), "renamed") == 0


def test_durable_sleep_suspends_and_wakes(drive: Driver) -> None:
    run = start("sample.sleep")
    drive.run_until(lambda: status(run) == RunStatus.SUSPENDED, what="the run to sleep")
    assert Run.objects.get(pk=run.pk).wake_at is not None
    run = driven(drive, run, timeout=30)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert effect_count(str(run.pk), "before") == 1, "replay did not run the first step again"
    assert effect_count(str(run.pk), "after") == 1


def test_step_retries_then_failure_cleans_up(drive: Driver) -> None:
    recovered = driven(drive, start("sample.fail", retries=2, fail_times=2))
    assert recovered.status == RunStatus.SUCCEEDED, recovered.error
    failed = driven(drive, start("sample.fail", retries=1, fail_times=5))
    assert failed.status == RunStatus.FAILED
    # Named as a pipeline author catches it, without the SDK's module path.
    assert failed.error == "StepFailed: step 'flaky' failed: RuntimeError: boom"
    assert effect_count(str(failed.pk), "flaky") == 2
    drive.run_until(lambda: all_deleted(failed), timeout=30, what="the failed run's records to be deleted")


def test_api_start_get_cancel_resume(workers: list[Worker], api: APIClient) -> None:
    bad = api.post("/api/v1/pipelines/sample.tree/runs/", {"inputs": {"branches": 0, "leaves": "many"}}, format="json")
    assert bad.status_code == 400
    assert set(bad.json()["fields"]) == {"inputs.branches", "inputs.leaves"}
    assert not Run.objects.exists()
    assert not Record.objects.filter(kind="graphene.run").exists()
    assert api.post("/api/v1/pipelines/nope/runs/", {}, format="json").status_code == 404

    started = api.post("/api/v1/pipelines/sample.step/runs/", {"inputs": {"seconds": 5}}, format="json")
    assert started.status_code == 201, started.content
    run_id = started.json()["id"]
    wait_for(lambda: effect_count(run_id, "act-started") == 1, what="the step to start")
    cancelled = api.post(f"/api/v1/runs/{run_id}/cancel/")
    assert cancelled.json()["status"] == "cancelled"
    resumed = api.post(f"/api/v1/runs/{run_id}/resume/")
    assert resumed.json()["status"] == "queued"
    finished(Run.objects.get(pk=run_id))
    detail = api.get(f"/api/v1/runs/{run_id}/").json()
    assert detail["status"] == "succeeded"
    assert [e["call"] for e in detail["journal"]] == ["step act", "step after"]
    # at least once: the interrupted step ran again on resume
    assert effect_count(run_id, "act-started") == 2
    listing = api.get("/api/v1/runs/?pipeline=sample.step&status=succeeded").json()
    assert [r["id"] for r in listing["results"]] == [run_id]
    pipelines = {p["name"]: p for p in api.get("/api/v1/pipelines/").json()["results"]}  # paged
    assert pipelines["sample.tree"]["input_schema"]["properties"]["branches"]["maximum"] == 10


def test_a_refused_declaration_is_journaled_and_replays(drive: Driver) -> None:
    run = driven(drive, start("sample.badspec"), timeout=30)
    assert run.status == RunStatus.SUCCEEDED, run.error
    entries = list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("seq", "call", "status"))
    assert entries == [
        (1, "declare test.sleep/wrong", EntryStatus.FAILED),
        (2, "step handled", EntryStatus.COMPLETED),
        (3, "sleep", EntryStatus.COMPLETED),
        (4, "step after", EntryStatus.COMPLETED),
    ]
    assert effect_count(str(run.pk), "handled") == 1
    assert run.attempt == 2


def test_drift_options_of_a_declaration_reach_its_record(drive: Driver) -> None:
    path = f"drift/{uuid.uuid4()}.conf"
    run = driven(drive, services.run_start(pipeline_name="sample.drift", inputs={"path": path}))
    assert run.status == RunStatus.SUCCEEDED, run.error
    record = Record.objects.get(created_by_run_id=run.record_id, kind="file")
    assert (record.drift_policy, record.observe_every) == ("report", 5)
    declared = JournalEntry.objects.get(run=run, seq=1)
    assert declared.call == "declare file/config", "options do not change the call's identity"


def test_a_nul_character_fails_the_run_with_the_reason_instead_of_wedging_it(drive: Driver) -> None:
    for where, said in (("output", "the value at text contains a NUL"), ("step", "the value contains a NUL")):
        run = driven(drive, start("sample.nul", where=where, retries=3))
        assert run.status == RunStatus.FAILED, where
        assert said in run.error, run.error
        assert "\x00" not in run.error
    # The step ran once: its value cannot be journaled, and its retries are for its own failures.
    assert effect_count(str(run.pk), "nul") == 1
    assert "returned a value that cannot be journaled" in run.error
