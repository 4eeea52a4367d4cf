"""Every write of pipelines and runs.

* ``definitions``: importing pipeline code, the pipelines' rows, validating inputs.
* ``transitions``: the one place a run's status changes (``run_transition``: checked
  against ``RUN_TRANSITIONS``, a ``RunEvent`` in the same transaction).
* ``starts``: starting runs and child runs under the pipeline's concurrency policy,
  cancelling, resuming.
* ``lifecycle``: the execution lease, suspending and waking, a run's end (which deletes
  everything it still owns, I3), stands.
* ``recovery``: the beat's safety net (deadlines, expired leases, due timers, lost messages).
* ``triggers``: upstream, cron and webhook triggers: reconciled with the code, fired once per
  cause, paused and resumed.

Celery carries run ids; the row decides what happens.
"""

from apps.pipelines.services.definitions import (
    definition_for_run,
    definition_get,
    inputs_validate,
    pipeline_sync,
    pipelines_load,
    pipelines_sync_all,
)
from apps.pipelines.services.lifecycle import (
    run_finish,
    run_lease_acquire,
    run_promote,
    run_suspend,
    runs_wake,
    runs_wake_on_command,
    runs_wake_on_records,
    stand_get,
    targets_settled,
)
from apps.pipelines.services.recovery import runs_recover, runs_take_over_on_worker_lost
from apps.pipelines.services.starts import run_cancel, run_resume, run_start, run_start_children
from apps.pipelines.services.transitions import (
    Actor,
    IllegalRunTransition,
    run_created,
    run_enqueue_on_commit,
    run_lock,
    run_transition,
)

__all__ = [
    "Actor",
    "IllegalRunTransition",
    "definition_for_run",
    "definition_get",
    "inputs_validate",
    "pipeline_sync",
    "pipelines_load",
    "pipelines_sync_all",
    "run_cancel",
    "run_created",
    "run_enqueue_on_commit",
    "run_finish",
    "run_lease_acquire",
    "run_lock",
    "run_promote",
    "run_resume",
    "run_start",
    "run_start_children",
    "run_suspend",
    "run_transition",
    "runs_recover",
    "runs_take_over_on_worker_lost",
    "runs_wake",
    "runs_wake_on_command",
    "runs_wake_on_records",
    "stand_get",
    "targets_settled",
]
