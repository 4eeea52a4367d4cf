"""Starts of one pipeline wait for each other only when its concurrency policy decides from its
other runs: ``parallel`` starts never wait (numbers from a sequence, each run its own tree
without a lock), ``queue`` starts take the pipeline's row lock one after the other."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.core import workers
from apps.core.models import AuditEntry, HeldLease
from apps.pipelines import services
from apps.pipelines.choices import RunStatus
from apps.pipelines.models import Run, RunEvent
from apps.records.models import Event, Record
from graphene_project.celery import Task
from tests.harness.wait import wait_for


def _in_thread(start: Callable[[], Run]) -> tuple[threading.Thread, list[Any]]:
    """``start()`` in a thread of its own (its own connection); its run or error lands in the list."""
    outcome: list[Any] = []

    def body() -> None:
        try:
            outcome.append(start())
        except BaseException as exc:  # reported by the test
            outcome.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread, outcome


@pytest.mark.django_db(transaction=True)
def test_concurrent_starts_of_a_parallel_pipeline_number_their_runs_once_each_in_trees_of_their_own() -> None:
    barrier = threading.Barrier(8)

    def start() -> Run:
        barrier.wait(timeout=30)
        return services.run_start(pipeline_name="sample.noop", inputs={"steps": 0})

    started = [_in_thread(start) for _ in range(8)]
    for thread, _ in started:
        thread.join(timeout=60)
    outcomes = [outcome[0] for _, outcome in started]
    assert all(isinstance(o, Run) for o in outcomes), outcomes
    runs = Run.objects.filter(pipeline__name="sample.noop")
    assert sorted(runs.values_list("number", flat=True)) == list(range(1, 9))
    roots = list(Record.objects.filter(pk__in=[r.pk for r in runs]))
    assert len({r.tree_id for r in roots}) == 8
    assert all((r.lft, r.rght, r.level, r.parent_id) == (1, 2, 0, None) for r in roots)
    assert Record.objects.filter(tree_id__in=[r.tree_id for r in roots]).count() == 8


@pytest.mark.django_db(transaction=True)
def test_a_parallel_start_does_not_wait_for_another_start_still_in_its_transaction() -> None:
    # The pipeline's first start made its row and its numbering (which later starts only read).
    services.run_start(pipeline_name="sample.noop", inputs={"steps": 0})
    with transaction.atomic():
        first = services.run_start(pipeline_name="sample.noop", inputs={"steps": 0})
        # Not committed yet: a lock taken by this start (the pipeline's row, the tree numbering)
        # would hold the next start until the commit below.
        thread, outcome = _in_thread(lambda: services.run_start(pipeline_name="sample.noop", inputs={"steps": 0}))
        wait_for(lambda: outcome, timeout=20, what="the second start to return while the first is uncommitted")
    thread.join(timeout=10)
    second = outcome[0]
    assert isinstance(second, Run), second
    assert {first.number, second.number} == {2, 3}
    assert Run.objects.filter(pk__in=[first.pk, second.pk]).count() == 2


class _RollBack(BaseException):
    """Raised past the start's error handling: its transaction rolls back."""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("commits", [True, False])
def test_a_run_sent_before_its_start_commits_is_executed_once_committed_and_dropped_if_not(
    monkeypatch: pytest.MonkeyPatch, commits: bool
) -> None:
    """A parallel start sends its run to a worker as soon as its first statement holds the
    run's start lock, before the run's rows are written: a worker that comes meanwhile waits
    for the start's transaction and takes the run in the same round trip (no second try, no
    locked path), or nothing if it rolled back."""
    services.run_start(pipeline_name="sample.noop", inputs={"steps": 0}, idempotency_key="row")  # its row, numbers
    sent: list[tuple[str, bool]] = []
    release = threading.Event()

    def apply_async(task: Task, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        # Inside the start's transaction (its connection): nothing of the run written yet.
        sent.append((args[0], Run.objects.filter(pk=args[0]).exists()))
        release.wait(timeout=30)  # hold the transaction open until released
        if not commits:
            raise _RollBack

    def take(run_id: str) -> tuple[Run, uuid.UUID] | None:
        with CaptureQueriesContext(connection) as queries:
            taken = services.run_lease_acquire(run_id=run_id)
        statements.extend(q["sql"] for q in queries.captured_queries)
        return taken

    statements: list[str] = []
    monkeypatch.setattr(Task, "apply_async", apply_async)
    starter, started = _in_thread(lambda: services.run_start(pipeline_name="sample.noop", inputs={"steps": 0}))
    run_id, written = wait_for(lambda: sent, timeout=20, what="the start to send its run")[0]
    assert not written, "the run was sent before its rows were written"
    taker, taken = _in_thread(lambda: take(run_id))  # type: ignore[arg-type,return-value]
    wait_for(_waiting_on_an_advisory_lock, timeout=20, what="the worker to wait for the start's transaction")
    assert not taken
    released = timezone.now()  # the start commits after this, and the take after that
    release.set()
    starter.join(timeout=20)
    taker.join(timeout=20)
    assert len(statements) == 2, statements  # the wait for the start's lock, then the take
    assert "pg_advisory_xact_lock" in statements[0], statements
    if commits:
        assert isinstance(started[0], Run), started
        assert taken[0] is not None, "the committed run was taken"
        run, _token = taken[0]
        assert (str(run.pk), run.status) == (run_id, RunStatus.RUNNING)
        assert run.started_at is not None
        assert run.lease_expires_at is not None
        assert released < run.started_at, "the take is stamped when it happened, not when the worker came"
        assert run.lease_expires_at == run.started_at + timedelta(seconds=settings.GRAPHENE_RUN_LEASE_SECONDS)
        assert list(RunEvent.objects.filter(run=run).order_by("id").values_list("reason", flat=True)) == [
            "Started",
            "Started",
        ]
    else:
        assert isinstance(started[0], _RollBack), started
        assert taken == [None], "a run that was never committed is not there to take"
        assert not Run.objects.filter(pk=run_id).exists()


@pytest.mark.django_db(transaction=True)
def test_a_worker_notes_a_run_lease_under_one_subject_however_it_took_it() -> None:
    """A queued run's lease (one statement) and a lease taken over (the locked path) are both
    noted as held by this worker, under the same words: a takeover finds either."""
    workers.heartbeat_start()
    try:
        queued = services.run_start(pipeline_name="sample.noop", inputs={"steps": 0})
        taken = services.run_lease_acquire(run_id=queued.pk)
        stalled = services.run_start(pipeline_name="sample.noop", inputs={"steps": 0})
        assert services.run_lease_acquire(run_id=stalled.pk) is not None
        Run.objects.filter(pk=stalled.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        taken_over = services.run_lease_acquire(run_id=stalled.pk)
        assert taken is not None
        assert taken_over is not None
        assert RunEvent.objects.filter(run=stalled).last().reason == "LeaseTakenOver"  # type: ignore[union-attr]
        held = dict(HeldLease.objects.filter(token__in=[taken[1], taken_over[1]]).values_list("token", "subject"))
        assert held == {taken[1]: f"run {queued.pk}", taken_over[1]: f"run {stalled.pk}"}
    finally:
        workers.heartbeat_stop()


def _waiting_on_an_advisory_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return bool(cursor.fetchone()[0])


def _waiting_for_us_on_the_pipeline_row() -> bool:
    """Another backend waits for a lock this connection's transaction holds, reading a pipeline row."""
    with connection.cursor() as cursor:
        # Inside a transaction PostgreSQL keeps the first view of pg_stat_activity: look afresh.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid)) "
            "AND query LIKE %s",
            ['SELECT "pipelines_pipeline".%'],  # the statement's start (pg_stat_activity keeps 1 kB of it)
        )
        return bool(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_queue_starts_take_turns_on_the_pipeline_lock() -> None:
    inputs = {"label": "a", "seconds": 0}
    turn = services.run_start(pipeline_name="sample.queue", inputs=inputs)  # holds the turn; made the row
    with transaction.atomic():
        first = services.run_start(pipeline_name="sample.queue", inputs=inputs)
        thread, outcome = _in_thread(lambda: services.run_start(pipeline_name="sample.queue", inputs=inputs))
        wait_for(
            _waiting_for_us_on_the_pipeline_row, timeout=20, what="the second start to wait for the first one's lock"
        )
        assert not outcome
    thread.join(timeout=20)
    second = outcome[0]
    assert isinstance(second, Run), second
    assert turn.status == RunStatus.QUEUED
    assert (first.status, second.status) == (RunStatus.WAITING, RunStatus.WAITING)
    assert [turn.number, first.number, second.number] == [1, 2, 3]  # numbered in the order they decided


@pytest.mark.django_db
def test_a_parallel_start_writes_its_run_in_one_statement(django_capture_on_commit_callbacks: Any) -> None:
    """The pipeline's row with the run's number and its tree's id drawn in the same statement,
    then the root, the run, their first events and the audit row in one statement; all of them
    readable after, the numbers the next ones."""
    services.run_start(pipeline_name="sample.noop", inputs={"steps": 0})  # the pipeline's row and sequences exist
    with django_capture_on_commit_callbacks(execute=False), CaptureQueriesContext(connection) as queries:
        run = services.run_start(pipeline_name="sample.noop", inputs={"steps": 0})
    statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(statements) == 2, statements
    assert "nextval" in statements[0], statements[0]
    assert "pipelines_pipeline" in statements[0], statements[0]
    assert run.number == Run.objects.filter(pipeline=run.pipeline).count()
    fresh = Run.objects.get(pk=run.pk)
    root = Record.objects.get(pk=run.pk)  # a run and its root share the id
    assert (fresh.status, root.name) == (RunStatus.QUEUED, f"sample.noop#{run.number}")
    assert (root.lft, root.rght, root.level) == (1, 2, 0)
    assert Record.objects.filter(tree_id=root.tree_id).count() == 1
    assert RunEvent.objects.get(run=run).created_at == fresh.created_at
    assert Event.objects.filter(record_id=run.pk, reason="Created").count() == 1
    assert AuditEntry.objects.filter(action="run.start", object_id=str(run.pk)).count() == 1


@pytest.mark.django_db
def test_a_parallel_start_whose_number_sequence_is_gone_numbers_after_the_highest_run() -> None:
    """The sequence a start reads with the pipeline's row is made on first use: a start that
    finds none (dropped here) makes it after the highest number in use, as the first did."""
    first = services.run_start(pipeline_name="sample.noop", inputs={"steps": 0})
    second = services.run_start(pipeline_name="sample.noop", inputs={"steps": 0})
    with connection.cursor() as cursor:
        cursor.execute(f'DROP SEQUENCE "pipelines_run_number_{first.pipeline_id}"')
    third = services.run_start(pipeline_name="sample.noop", inputs={"steps": 0})
    fourth = services.run_start(pipeline_name="sample.noop", inputs={"steps": 0})
    assert [first.number, second.number, third.number, fourth.number] == [1, 2, 3, 4]
    runs = [first, second, third, fourth]
    trees = Record.objects.filter(pk__in=[r.pk for r in runs]).values_list("tree_id", flat=True)
    assert len(set(trees)) == 4


@pytest.mark.django_db(transaction=True)
def test_a_queued_runs_lease_is_taken_in_one_statement_with_what_the_execution_needs() -> None:
    """A queued run's move to running, its event and its pipeline's and revision's rows come
    from one statement, outside any transaction of its own, sent with the wait for its start's
    lock (free here) in one round trip, and committed without waiting for the disk (that
    transaction alone: the worker's next writes wait as ever); a run that is not queued is
    locked and read first (one read, one write), and a run held already is not taken."""
    run = services.run_start(pipeline_name="sample.noop", inputs={"steps": 0})
    with CaptureQueriesContext(connection) as queries:
        acquired = services.run_lease_acquire(run_id=run.pk)
        assert acquired is not None
        taken, token = acquired
        named = (taken.pipeline.name, taken.revision, services.definition_for_run(taken).name)
    statements = [q["sql"] for q in queries.captured_queries]
    assert len(statements) == 2, statements
    assert "pg_advisory_xact_lock" in statements[0], statements
    assert "set_config('synchronous_commit', 'off', true)" in statements[0], statements
    assert "UPDATE pipelines_run" in statements[1], statements
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('synchronous_commit')")
        assert cursor.fetchone()[0] == "on", "the take's setting outlived its transaction"
    assert named == ("sample.noop", None, "sample.noop")
    assert (taken.status, taken.lease_token, taken.attempt) == (RunStatus.RUNNING, token, 1)
    fresh = Run.objects.get(pk=run.pk)
    assert (fresh.status, fresh.lease_token, fresh.attempt) == (RunStatus.RUNNING, token, 1)
    assert fresh.started_at is not None
    assert fresh.lease_expires_at is not None
    assert fresh.lease_expires_at > fresh.started_at
    moved = RunEvent.objects.filter(run=run).last()
    assert moved is not None
    assert (moved.from_status, moved.to_status, moved.reason, moved.data) == (
        "queued",
        "running",
        "Started",
        {"attempt": 1},
    )
    with CaptureQueriesContext(connection) as queries:
        assert services.run_lease_acquire(run_id=run.pk) is None  # held: nothing to take
    statements = [q["sql"] for q in queries.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(statements) == 3, statements
    assert "FOR NO KEY UPDATE" in statements[2], statements
    assert Run.objects.get(pk=run.pk).lease_token == token
    with pytest.raises(Run.DoesNotExist), transaction.atomic():
        services.run_lock(uuid.uuid4())  # no such run


@pytest.mark.django_db(transaction=True)
def test_a_lease_taken_inside_a_callers_transaction_leaves_its_commit_waiting_for_the_disk() -> None:
    """Only a take that is its own transaction commits without waiting for the disk: inside a
    caller's, whose other writes may need to last, the setting is not touched."""
    run = services.run_start(pipeline_name="sample.noop", inputs={"steps": 0})
    with transaction.atomic():
        assert services.run_lease_acquire(run_id=run.pk) is not None
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('synchronous_commit')")
            assert cursor.fetchone()[0] == "on"
    assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING


@pytest.mark.django_db(transaction=True)
def test_a_runs_end_locks_its_root_with_the_run_and_asks_its_deletion(
    django_capture_on_commit_callbacks: Any,
) -> None:
    """One statement locks and reads the run and its tree's root; the deletion request that
    follows does not lock the root again."""
    run = services.run_start(pipeline_name="sample.noop", inputs={"steps": 0})
    with django_capture_on_commit_callbacks(execute=False), CaptureQueriesContext(connection) as queries:
        assert services.run_finish(run=run, status=RunStatus.CANCELLED, reason="Cancelled")
    statements = [q["sql"] for q in queries.captured_queries]
    locks = [s for s in statements if "FOR NO KEY UPDATE" in s]
    assert len(locks) == 1, locks
    assert locks[0].endswith("FOR NO KEY UPDATE OF r, rec")
    assert run.record_id is not None
    assert Record.objects.get(pk=run.record_id).deletion_requested_at is not None
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED
