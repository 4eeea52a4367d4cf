"""Pipelines and runs: loading definitions, starting, waking, cancelling, resuming, recovering.

A run's lifecycle (``RunStatus``) moves only through ``_set_status``, under the run row's
lock. Celery carries run ids; the row decides what happens. Every exit path of a run
(succeeded, failed, cancelled, timed out) requests deletion of the run's record tree in
the same transaction, so nothing it still owns survives it (I3).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import threading
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.db.models import Max
from django.utils import timezone
from graphene_sdk import Pipeline as Definition
from graphene_sdk import registered
from pydantic import ValidationError

from apps.agents.models import AgentCommand
from apps.core import domain
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.core.events import publish_on_commit
from apps.observability import metrics
from apps.pipelines.choices import ACTIVE, NOT_ENDED, TERMINAL, RunStatus
from apps.pipelines.models import Pipeline, Run, RunWait
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Record

logger = logging.getLogger(__name__)

Actor = AbstractBaseUser | AnonymousUser | None

_load_lock = threading.Lock()
_loaded = False


def _import_file(path: Path) -> None:
    name = f"graphene_pipelines.{path.stem}"
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import pipeline file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def pipelines_load() -> dict[str, Definition[Any, Any]]:
    """Import the pipeline modules and directories named in settings (once per process)."""
    global _loaded
    if not _loaded:
        with _load_lock:
            if not _loaded:
                for module in settings.GRAPHENE_PIPELINE_MODULES:
                    importlib.import_module(module)
                for directory in settings.GRAPHENE_PIPELINE_DIRS:
                    for path in sorted(Path(directory).glob("*.py")):
                        if not path.name.startswith("_"):
                            _import_file(path)
                _loaded = True
    return registered()


def definition_get(name: str) -> Definition[Any, Any]:
    loaded = pipelines_load()
    try:
        return loaded[name]
    except KeyError:
        known = ", ".join(sorted(loaded)) or "none"
        raise NotFound(f"no pipeline {name!r} is loaded; loaded pipelines: {known}") from None


def pipeline_sync(definition: Definition[Any, Any]) -> Pipeline:
    """The Pipeline row for a loaded definition, updated if the code changed."""
    fields = {
        "source": definition.source,
        "description": definition.description,
        "input_schema": definition.input_schema(),
        "output_schema": definition.output_schema(),
        "concurrency": definition.concurrency,
        "timeout_seconds": int(definition.timeout.total_seconds()) if definition.timeout else None,
        "is_loaded": True,
    }
    row = Pipeline.objects.filter(name=definition.name).first()
    if row is None:
        row, _ = Pipeline.objects.get_or_create(name=definition.name, defaults=fields)
        return row
    changed = {k: v for k, v in fields.items() if getattr(row, k) != v}
    if changed:
        Pipeline.objects.filter(pk=row.pk).update(**changed, updated_at=timezone.now())
        for key, value in changed.items():
            setattr(row, key, value)
    return row


def pipelines_sync_all() -> list[Pipeline]:
    rows = [pipeline_sync(d) for _, d in sorted(pipelines_load().items())]
    Pipeline.objects.exclude(pk__in=[r.pk for r in rows]).filter(is_loaded=True).update(is_loaded=False)
    return rows


def inputs_validate(definition: Definition[Any, Any], inputs: Any) -> dict[str, Any]:
    """Validate against the pipeline's input model; errors by field path, as the API returns them."""
    if not isinstance(inputs, dict):
        raise ValidationFailed("inputs must be a JSON object", fields={"inputs": ["must be a JSON object"]})
    try:
        model = definition.inputs.model_validate(inputs)
    except ValidationError as exc:
        fields: dict[str, list[str]] = {}
        for error in exc.errors():
            path = ".".join(str(p) for p in ("inputs", *error["loc"]))
            fields.setdefault(path, []).append(error["msg"])
        summary = "; ".join(f"{k}: {', '.join(v)}" for k, v in fields.items())
        raise ValidationFailed(f"inputs do not match {definition.name}'s schema: {summary}", fields=fields) from None
    dumped: dict[str, Any] = model.model_dump(mode="json")
    return dumped


# --- status changes ---------------------------------------------------------------------------


def _publish(run: Run) -> None:
    payload = {"event": "run.changed", "id": str(run.pk), "status": run.status}
    publish_on_commit(f"run.{run.pk}", payload)
    publish_on_commit("runs", payload)


def _enqueue_on_commit(run_id: Any, countdown: float = 0) -> None:
    from apps.pipelines.tasks import run_execute_task

    transaction.on_commit(lambda: run_execute_task.apply_async((str(run_id),), countdown=countdown))


def _set_status(run: Run, status: str, **fields: Any) -> None:
    """Write a status change of a locked run row and tell watchers after commit."""
    now = timezone.now()
    fields = {"status": status, "updated_at": now, **fields}
    Run.objects.filter(pk=run.pk).update(**fields)
    for key, value in fields.items():
        setattr(run, key, value)
    _publish(run)


def _lock(run_id: Any) -> Run:
    return Run.objects.select_for_update(no_key=True).get(pk=run_id)


def stand_get(pipeline_name: str) -> Record:
    """The pipeline's stand: a root record that holds what runs hand over (created on demand)."""
    return records.record_ensure_root(kind="graphene.stand", name=pipeline_name)


def _hand_to_stand(run: Run, keep_for: timedelta) -> tuple[int, list[str]]:
    """Give everything the run's root still owns to the stand, each part with a TTL.

    A part the stand cannot take (it already holds one of that kind and name, from an
    earlier run) is deleted with the run instead, and named in the returned list.
    """
    stand = stand_get(run.pipeline.name)
    until = timezone.now() + keep_for
    kept, refused = 0, []
    for child in Record.objects.filter(parent_id=run.record_id).exclude(phase=Phase.DELETED).order_by("lft"):
        if child.deletion_requested_at is not None:
            continue
        try:
            with transaction.atomic():
                records.record_transfer(record=child, new_owner=stand, expires_at=until)
        except Conflict as exc:
            refused.append(f"{child.kind}/{child.name}: {exc.detail}")
        else:
            kept += 1
    return kept, refused


def run_finish(
    *,
    run: Run,
    status: str,
    outputs: Any = None,
    error: str = "",
    token: Any = None,
    keep_for: timedelta | None = None,
) -> bool:
    """End a run and delete everything it still owns (I3); its child runs end with it.

    ``token`` fences a worker's own finish (only the lease holder may end a running run).
    ``keep_for`` (a failed run's ``keep_on_failure``) first hands what it owns to the stand.
    """
    assert status in TERMINAL
    error = error.replace("\x00", "\\x00")  # PostgreSQL text cannot hold NUL (an exception's message may)
    with transaction.atomic():
        run = _lock(run.pk)
        if run.status in TERMINAL or (
            token is not None and (run.lease_token != token or run.status != RunStatus.RUNNING)
        ):
            return False
        if keep_for and status == RunStatus.FAILED and run.record_id:
            kept, refused = _hand_to_stand(run, keep_for)
            if kept:
                error = f"{error}\n(kept {kept} record(s) on the stand {run.pipeline.name!r} for {keep_for})".lstrip()
            if refused:
                error = f"{error}\n(not kept, deleted with the run: {'; '.join(refused)})"
        finished_at = timezone.now()
        if run.started_at is not None:  # observability: every way a run ends (cancel, timeout too)
            seconds = (finished_at - run.started_at).total_seconds()
            metrics.observe(metrics.RUN_DURATION_SECONDS, seconds, pipeline=run.pipeline.name, status=status)
        _set_status(
            run,
            status,
            outputs=outputs,
            error=error,
            finished_at=finished_at,
            lease_token=None,
            lease_expires_at=None,
            waiting_on=[],
            wake_at=None,
        )
        RunWait.objects.filter(run=run).delete()
        if run.record_id is not None:
            root = Record.objects.filter(pk=run.record_id).first()
            if root is not None and root.phase != Phase.DELETED:
                records.record_delete_request(record=root, reason=f"Run{status.title().replace('_', '')}")
        children = Run.objects.filter(parent_run=run, status__in=list(NOT_ENDED)).order_by("number")
        for child in children:
            run_finish(run=child, status=RunStatus.CANCELLED, error=f"its parent run {run} ended ({status})")
        if run.parent_run_id is not None:
            _promote_sibling(run)
            _wake_on_commit([str(run.pk)])
        elif run.pipeline.concurrency == "queue":
            _promote_next_in_line(run.pipeline_id)
    return True


def _promote(run: Run) -> None:
    deadline = None
    definition = registered().get(run.pipeline.name)
    if definition is not None and definition.timeout:
        deadline = timezone.now() + definition.timeout
    _set_status(run, RunStatus.QUEUED, deadline_at=deadline)
    _enqueue_on_commit(run.pk)


def _promote_next_in_line(pipeline_id: Any) -> None:
    """``queue`` pipelines: when no run holds the turn, the oldest waiting run takes it."""
    Pipeline.objects.select_for_update().get(pk=pipeline_id)
    if Run.objects.filter(pipeline_id=pipeline_id, parent_run__isnull=True, status__in=list(ACTIVE)).exists():
        return
    nxt = (
        Run.objects.select_for_update(no_key=True)
        .filter(pipeline_id=pipeline_id, parent_run__isnull=True, status=RunStatus.WAITING)
        .order_by("number")
        .first()
    )
    if nxt is not None:
        _promote(nxt)


def _promote_sibling(child: Run) -> None:
    """``run_all``: a child ended, so the next waiting sibling of its group may start."""
    _lock(child.parent_run_id)  # serializes promotions among siblings
    nxt = (
        Run.objects.select_for_update(no_key=True)
        .filter(parent_run_id=child.parent_run_id, group=child.group, status=RunStatus.WAITING)
        .order_by("group_index")
        .first()
    )
    if nxt is not None:
        _promote(nxt)


# --- start, cancel, resume ----------------------------------------------------------------------


def _create_run(
    *,
    definition: Definition[Any, Any],
    row: Pipeline,
    inputs: dict[str, Any],
    status: str,
    actor: Actor = None,
    parent: Run | None = None,
    group: int | None = None,
    group_index: int | None = None,
) -> Run:
    number = (Run.objects.filter(pipeline=row).aggregate(n=Max("number"))["n"] or 0) + 1
    root = records.record_create_root(kind="graphene.run", name=f"{row.name}#{number}", actor=actor)
    deadline = timezone.now() + definition.timeout if definition.timeout and status == RunStatus.QUEUED else None
    run = Run.objects.create(
        id=root.pk,
        pipeline=row,
        number=number,
        record=root,
        inputs=inputs,
        status=status,
        deadline_at=deadline,
        created_by=actor if actor is not None and actor.is_authenticated else None,  # type: ignore[misc]
        parent_run=parent,
        group=group,
        group_index=group_index,
    )
    _publish(run)
    if status == RunStatus.QUEUED:
        _enqueue_on_commit(run.pk)
    return run


def run_start(*, pipeline_name: str, inputs: Any, actor: Actor = None) -> Run:
    """Validate the inputs, apply the pipeline's concurrency policy, create the run, enqueue it.

    ``queue``: the run waits its turn behind the active one (refused beyond ``max_pending``);
    ``cancel_previous``: active runs are cancelled (and cleaned up) first.
    """
    definition = definition_get(pipeline_name)
    clean = inputs_validate(definition, inputs)
    with transaction.atomic():
        row = pipeline_sync(definition)
        row = Pipeline.objects.select_for_update().get(pk=row.pk)  # serializes numbering and turns
        status = RunStatus.QUEUED
        active = Run.objects.filter(pipeline=row, parent_run__isnull=True, status__in=list(ACTIVE))
        if definition.concurrency == "queue":
            waiting = Run.objects.filter(pipeline=row, parent_run__isnull=True, status=RunStatus.WAITING).count()
            if active.exists() or waiting:
                if definition.max_pending is not None and waiting >= definition.max_pending:
                    raise Conflict(
                        f"pipeline {row.name!r} runs one at a time and already has {waiting} run(s) waiting "
                        f"(max_pending={definition.max_pending}); wait for one to finish or cancel one",
                        code="concurrency_limit",
                    )
                status = RunStatus.WAITING
        elif definition.concurrency == "cancel_previous":
            for previous in active.order_by("number"):
                run_finish(
                    run=previous, status=RunStatus.CANCELLED, error="cancelled: a newer run of the pipeline started"
                )
        run = _create_run(definition=definition, row=row, inputs=clean, status=status, actor=actor)
    return run


def run_start_children(
    *, parent: Run, pipeline_name: str, inputs: list[Any], concurrency: int, group: int
) -> list[Run]:
    """Start the child runs of a ``run_all``: the first ``concurrency`` queued, the rest waiting."""
    definition = definition_get(pipeline_name)
    clean = [inputs_validate(definition, item) for item in inputs]
    row = pipeline_sync(definition)
    row = Pipeline.objects.select_for_update().get(pk=row.pk)
    return [
        _create_run(
            definition=definition,
            row=row,
            inputs=item,
            status=RunStatus.QUEUED if index < concurrency else RunStatus.WAITING,
            parent=parent,
            group=group,
            group_index=index,
        )
        for index, item in enumerate(clean)
    ]


def run_cancel(*, run: Run, actor: Actor = None) -> Run:
    """Cancel: the run ends now and its tree is deleted; a worker still executing it is fenced off."""
    who = actor.get_username() if actor is not None and actor.is_authenticated else "system"
    run_finish(run=run, status=RunStatus.CANCELLED, error=f"cancelled by {who}")
    return Run.objects.get(pk=run.pk)


def run_resume(*, run: Run, actor: Actor = None) -> Run:
    """Run again by replay: journaled calls return their results, nothing journaled is redone.

    A suspended run is woken now. An ended run (not a successful one) gets a new root record
    if its old tree is gone, since what it owned was deleted when it ended.
    """
    with transaction.atomic():
        run = _lock(run.pk)
        if run.status == RunStatus.SUCCEEDED:
            raise Conflict(f"run {run} succeeded; start a new run instead of resuming it")
        if run.status in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING):
            return run
        fields: dict[str, Any] = {"waiting_on": [], "wake_at": None}
        if run.status in TERMINAL:
            root = Record.objects.filter(pk=run.record_id).first() if run.record_id else None
            if root is None or root.phase == Phase.DELETED or root.deletion_requested_at is not None:
                # The new tree's root names its run: the run's id is its first root's id only.
                root = records.record_create_root(
                    kind="graphene.run",
                    name=f"{run.pipeline.name}#{run.number}",
                    spec={"run": str(run.pk)},
                    actor=actor,
                )
            fields |= {"record": root, "finished_at": None, "error": "", "outputs": None}
            definition = definition_get(run.pipeline.name)
            if definition.timeout:
                fields["deadline_at"] = timezone.now() + definition.timeout
        RunWait.objects.filter(run=run).delete()
        _set_status(run, RunStatus.QUEUED, **fields)
        _enqueue_on_commit(run.pk)
    return run


# --- waking and recovery ----------------------------------------------------------------------


def _wake_on_commit(targets: list[str]) -> None:
    transaction.on_commit(lambda: runs_wake(targets=targets))


def runs_wake(*, targets: Iterable[Any]) -> int:
    """Records or child runs settled: re-queue the suspended runs waiting for any of them."""
    run_ids = set(RunWait.objects.filter(target__in=list(targets)).values_list("run_id", flat=True))
    woken = 0
    for run_id in sorted(run_ids):
        with transaction.atomic():
            run = Run.objects.select_for_update(no_key=True).filter(pk=run_id).first()
            if run is None or run.status != RunStatus.SUSPENDED:
                continue
            RunWait.objects.filter(run=run).delete()
            _set_status(run, RunStatus.QUEUED, waiting_on=[], wake_at=None)
            _enqueue_on_commit(run.pk)
            woken += 1
    return woken


def runs_wake_on_records(event: domain.RecordsSettled) -> None:
    """Subscriber: records settled; the runs suspended on one of them go again."""
    runs_wake(targets=event.record_ids)


def runs_wake_on_command(event: domain.CommandFinished) -> None:
    """Subscriber: an agent command a run waits on (``exec``, ``call`` ...) ended."""
    if event.waiting_record_id is None and not event.awaited_in_place:
        runs_wake(targets=[event.command_id])


def targets_settled(targets: Iterable[Any]) -> set[str]:
    """Which of these record or run ids have settled (a record no longer converging, a run ended)."""
    ids = [str(t) for t in targets]
    done = {
        str(pk)
        for pk in Record.objects.filter(pk__in=ids)
        .exclude(phase__in=[Phase.PENDING, Phase.CREATING, Phase.UPDATING], deletion_requested_at__isnull=True)
        .values_list("pk", flat=True)
    }
    done |= {str(pk) for pk in Run.objects.filter(pk__in=ids, status__in=list(TERMINAL)).values_list("pk", flat=True)}
    done |= {
        str(pk)
        for pk in AgentCommand.objects.filter(pk__in=ids, finished_at__isnull=False).values_list("pk", flat=True)
    }
    return done


def runs_recover(*, now: datetime | None = None, limit: int = 200) -> dict[str, int]:
    """The beat's safety net: expired leases, due timers, lost messages and wake-ups, deadlines."""
    now = now or timezone.now()
    counts = {"lease_expired": 0, "timer_due": 0, "requeued": 0, "timed_out": 0, "rewoken": 0}
    for run in Run.objects.filter(deadline_at__lte=now, status__in=list(ACTIVE)).order_by("deadline_at")[:limit]:
        if run_finish(run=run, status=RunStatus.TIMED_OUT, error=f"run exceeded its deadline at {run.deadline_at}"):
            counts["timed_out"] += 1
    stale = timedelta(seconds=settings.GRAPHENE_RUN_LEASE_SECONDS)
    # A wake-up lost between a commit and its notification: look again at runs that have
    # waited a while (oldest first, touched so that the scan rotates).
    waiting = list(
        Run.objects.filter(status=RunStatus.SUSPENDED, wake_at__isnull=True, updated_at__lt=now - stale)
        .order_by("updated_at")
        .values_list("pk", flat=True)[:limit]
    )
    if waiting:
        targets = RunWait.objects.filter(run_id__in=waiting).values_list("target", flat=True)
        counts["rewoken"] = runs_wake(targets=targets_settled(targets))
        Run.objects.filter(pk__in=waiting, status=RunStatus.SUSPENDED).update(updated_at=now)
    expired = Run.objects.filter(status=RunStatus.RUNNING, lease_expires_at__lt=now).values_list("pk", flat=True)
    due = Run.objects.filter(status=RunStatus.SUSPENDED, wake_at__lte=now).values_list("pk", flat=True)
    lost = Run.objects.filter(status=RunStatus.QUEUED, updated_at__lt=now - stale).values_list("pk", flat=True)
    for key, ids in (("lease_expired", expired[:limit]), ("timer_due", due[:limit]), ("requeued", lost[:limit])):
        for run_id in ids:
            with transaction.atomic():
                run = _lock(run_id)
                if key == "lease_expired" and not (
                    run.status == RunStatus.RUNNING and run.lease_expires_at and run.lease_expires_at < now
                ):
                    continue
                if key == "timer_due" and not (
                    run.status == RunStatus.SUSPENDED and run.wake_at and run.wake_at <= now
                ):
                    continue
                if key == "requeued" and run.status != RunStatus.QUEUED:
                    continue
                RunWait.objects.filter(run=run).delete()
                _set_status(run, RunStatus.QUEUED, lease_token=None, lease_expires_at=None, waiting_on=[], wake_at=None)
                _enqueue_on_commit(run.pk)
                counts[key] += 1
    return counts
