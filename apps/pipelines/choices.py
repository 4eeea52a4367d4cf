from django.db import models


class RunStatus(models.TextChoices):
    # Waiting its turn: behind the running run of a ``queue`` pipeline, or behind its siblings
    # of a ``run_all`` that is at its concurrency limit.
    WAITING = "waiting", "Waiting"
    # Waiting for a worker to take it.
    QUEUED = "queued", "Queued"
    # A worker holds the lease and is executing (replaying) the pipeline function.
    RUNNING = "running", "Running"
    # Waiting for records to settle or a timer; no worker is held.
    SUSPENDED = "suspended", "Suspended"
    # The function returned; everything the run still owned is being deleted.
    SUCCEEDED = "succeeded", "Succeeded"
    # The function raised (or diverged from its journal); its resources are being deleted.
    FAILED = "failed", "Failed"
    # Someone cancelled the run; its resources are being deleted.
    CANCELLED = "cancelled", "Cancelled"
    # The run exceeded its deadline; its resources are being deleted.
    TIMED_OUT = "timed_out", "Timed out"


TERMINAL = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT})

# The legal moves of a run's status; ``run_transition`` refuses any other and writes a
# ``RunEvent`` for each. A move to the same status is a new attempt at it (a lost message
# re-queued, a lease taken over from a dead worker).
RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    # its turn came (queue), or a sibling's slot freed up (run_all); or cancelled while waiting
    RunStatus.WAITING: frozenset({RunStatus.QUEUED, RunStatus.CANCELLED}),
    # a worker took its lease; re-queued after a lost message; or ended from outside
    RunStatus.QUEUED: frozenset({RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.TIMED_OUT}),
    # ended by its worker or from outside; suspended; given back to the queue (lease expired,
    # woken while suspending); or taken over by another worker once its lease expired
    RunStatus.RUNNING: frozenset(
        {
            RunStatus.RUNNING,
            RunStatus.QUEUED,
            RunStatus.SUSPENDED,
            RunStatus.SUCCEEDED,
            RunStatus.FAILED,
            RunStatus.CANCELLED,
            RunStatus.TIMED_OUT,
        }
    ),
    # woken (a record settled, its timer came, resumed), taken at once by a worker whose timer
    # was due, or ended from outside
    RunStatus.SUSPENDED: frozenset({RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.TIMED_OUT}),
    RunStatus.SUCCEEDED: frozenset(),
    # an ended run that did not succeed can be resumed (replayed from its journal)
    RunStatus.FAILED: frozenset({RunStatus.QUEUED}),
    RunStatus.CANCELLED: frozenset({RunStatus.QUEUED}),
    RunStatus.TIMED_OUT: frozenset({RunStatus.QUEUED}),
}
# Holding (or about to hold) the pipeline's turn.
ACTIVE = frozenset({RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.SUSPENDED})
NOT_ENDED = ACTIVE | {RunStatus.WAITING}


class EntryStatus(models.TextChoices):
    # An at-most-once step began; it has not reported an outcome.
    STARTED = "started", "Started"
    # The call finished; ``result`` is what replay returns.
    COMPLETED = "completed", "Completed"
    # The call failed; replay raises the same error.
    FAILED = "failed", "Failed"
    # An at-most-once step was interrupted; replay raises OutcomeUnknown.
    UNKNOWN = "unknown", "Outcome unknown"


# The journal's call name of ``ctx.attach_artifact`` (its entries' results name the artifact).
ATTACH_ARTIFACT_CALL = "attach_artifact "


class TriggerType(models.TextChoices):
    UPSTREAM = "upstream", "Upstream"
    CRON = "cron", "Cron"
    WEBHOOK = "webhook", "Webhook"


class FiringStatus(models.TextChoices):
    # Seen (an upstream run ended, a cron instant came, a delivery arrived); its run not started yet.
    PENDING = "pending", "Pending"
    STARTED = "started", "Started"
    # The trigger was paused when it fired: nothing started (the trigger's events say so).
    SKIPPED = "skipped", "Skipped"
    # The start was refused (inputs, the concurrency policy's limit, the code gone): see ``error``.
    FAILED = "failed", "Failed"


# What an upstream trigger's ``on`` matches.
UPSTREAM_OUTCOMES: dict[str, frozenset[str]] = {
    "succeeded": frozenset({RunStatus.SUCCEEDED}),
    "failed": frozenset({RunStatus.FAILED, RunStatus.TIMED_OUT}),
    "any": TERMINAL,
}
