"""One execution of a run, from taking its lease to suspending or ending it: the body of the
Celery task ``run_execute_task``."""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone
from graphene_sdk import (
    ChildRunFailed,
    Context,
    NonDeterminismError,
    OutcomeUnknown,
    RemoteError,
    ResourceFailed,
    StepFailed,
)
from graphene_sdk import Pipeline as Definition

from apps.core import access, audit, workers
from apps.pipelines import services
from apps.pipelines.choices import RunStatus
from apps.pipelines.engine.execution import Execution
from apps.pipelines.engine.journal import _Fenced, _Suspend, to_json
from apps.pipelines.models import Run

logger = logging.getLogger(__name__)

# Errors whose message says it all; any other error's run keeps its whole traceback.
_EXPLAINED = (NonDeterminismError, OutcomeUnknown, StepFailed, ResourceFailed, ChildRunFailed, RemoteError)


class _LeaseRenewer:
    """One thread per process extends the leases of the runs the process executes, each a third
    of a lease after the last, and flags an execution whose lease is gone (taken over, or its
    run ended). A thread started for each execution delayed every run's first step by its start.
    The thread closes its database connection whenever it has nothing to renew."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[Execution, float] = {}
        self._pid = 0

    def add(self, execution: Execution) -> None:
        with self._cond:
            if self._pid != os.getpid():  # the first execution of this process (a pool child is forked)
                self._due.clear()
                threading.Thread(target=self._serve, name="run-leases", daemon=True).start()
                self._pid = os.getpid()
            # No wake-up needed: the thread's wait ends no later than this new due time.
            self._due[execution] = time.monotonic() + settings.GRAPHENE_RUN_LEASE_SECONDS / 3

    def remove(self, execution: Execution) -> None:
        with self._cond:
            self._due.pop(execution, None)
            if not self._due:
                self._cond.notify()  # nothing left: its connection is closed now, not a third later

    def _serve(self) -> None:
        while True:
            execution = self._next_due()
            try:
                self._renew(execution)
            except Exception:  # the lease has two thirds left: try again at the next third
                logger.warning("run %s: could not extend its lease", execution.run_id, exc_info=True)
                connection.close()

    def _next_due(self) -> Execution:
        """Wait until an execution's lease is due for extension; it is next due a third later."""
        with self._cond:
            while True:
                if not self._due:
                    connection.close()
                    self._cond.wait(settings.GRAPHENE_RUN_LEASE_SECONDS / 3)
                    continue
                execution, at = min(self._due.items(), key=lambda item: item[1])
                now = time.monotonic()
                if at <= now:
                    self._due[execution] = now + settings.GRAPHENE_RUN_LEASE_SECONDS / 3
                    return execution
                self._cond.wait(at - now)

    def _renew(self, execution: Execution) -> None:
        execution.telemetry.flush()  # long executions write their spans as they go
        extended = Run.objects.filter(
            pk=execution.run.pk, lease_token=execution.token, status=RunStatus.RUNNING
        ).update(lease_expires_at=timezone.now() + timedelta(seconds=settings.GRAPHENE_RUN_LEASE_SECONDS))
        if not extended:
            execution.journal.lost.set()
            self.remove(execution)


_leases = _LeaseRenewer()


def _output(definition: Definition[Any, Any], value: Any) -> Any:
    if value is None:
        return None
    if definition.output is not None and not isinstance(value, definition.output):
        raise TypeError(
            f"{definition.name} must return {definition.output.__name__} or None, not {type(value).__name__}"
        )
    return to_json(value)


def _failure_text(error: BaseException) -> str:
    """A failed run's error: the SDK's own errors by their class name (``StepFailed: ...``,
    what a user reads in ``except StepFailed``), any other with its whole traceback."""
    if not isinstance(error, _EXPLAINED):
        return "".join(traceback.format_exception(type(error), error, error.__traceback__))
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, RemoteError) and error.remote_traceback:
        return f"{text}\n\nOn the machine:\n{error.remote_traceback}"  # the traceback that matters
    return text


def run_execute(*, run_id: Any) -> None:
    """Execute (replay) a run until it ends or suspends. The Celery task's body (its database
    connections are recycled around every task: graphene_project/celery.py)."""
    acquired = services.run_lease_acquire(run_id=run_id)
    if acquired is None:
        return
    run, token = acquired
    try:
        try:
            definition = services.definition_for_run(run)
            inputs = definition.inputs.model_validate(run.inputs)
        except Exception as exc:
            error = f"cannot load the pipeline: {exc}"
            services.run_finish(run=run, status=RunStatus.FAILED, error=error, token=token)
            return
        # What the run's code changes (declarations, deletions, hand-overs, commands) and its end
        # are the run's doing: the audit trail names it as their actor.
        with audit.acting(audit.who_run(run.pk, f"{run.pipeline.name}#{run.number}")):
            _execute(run, token, definition, inputs)
    finally:
        workers.lease_release(token=token)  # however the execution ended


def _execute(run: Run, token: Any, definition: Definition[Any, Any], inputs: Any) -> None:
    """One execution of the run's function, holding its lease, to its suspension or its end."""
    execution = Execution(run, token, definition)
    journal = execution.journal
    _leases.add(execution)
    try:
        try:
            with access.acting_in(run.namespace):  # secrets and the like are read in the run's namespace
                value = definition.fn(Context(execution), inputs)
            if journal.divergence is not None:
                raise journal.divergence
            extra = journal.leftover()
            if extra is not None:
                raise NonDeterminismError(
                    f"non-deterministic pipeline: the program ended after {journal.seq} calls but the journal "
                    f"recorded call #{extra.seq} {extra.call!r}",
                    seq=extra.seq,
                    journaled=extra.call,
                    called="(end of program)",
                )
            outputs = _output(definition, value)
        except _Suspend as suspend:
            execution.telemetry.end("suspended")  # written before the run's status changes
            services.run_suspend(
                run_id=run.pk,
                token=token,
                waiting_on=suspend.waiting_on,
                wake_at=suspend.wake_at,
                until=suspend.until,
            )
            return
        except _Fenced:
            execution.telemetry.end("fenced")
            logger.info("run %s: lease lost or run ended; this worker stops", run.pk)
            return
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            text = _failure_text(exc if journal.divergence is None else journal.divergence)
            execution.telemetry.end("failed", text.strip().splitlines()[-1])
            services.run_finish(
                run=run, status=RunStatus.FAILED, error=text, token=token, keep_for=definition.keep_on_failure
            )
            return
        execution.telemetry.end("succeeded")
        services.run_finish(run=run, status=RunStatus.SUCCEEDED, outputs=outputs, token=token)
    finally:
        execution.telemetry.end("aborted")  # a no-op unless an exit above was missed
        _leases.remove(execution)
        execution.close()
