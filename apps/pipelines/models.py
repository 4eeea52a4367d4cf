"""Pipelines, runs and their journals."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.fields.json import KeyTextTransform

from apps.core.models import TimeStampedModel
from apps.pipelines.choices import ATTACH_ARTIFACT_CALL, EntryStatus, RunStatus


class Pipeline(TimeStampedModel):
    """A pipeline definition as last loaded from code: name, schemas, policies."""

    name = models.CharField(max_length=200, unique=True)
    namespace = models.CharField(max_length=63, default="default", db_index=True)
    source = models.CharField(max_length=400, help_text="module:function")
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict)
    output_schema = models.JSONField(null=True, blank=True)
    concurrency = models.CharField(max_length=20, default="parallel")
    # With ``queue``: how many runs may wait their turn (a start beyond it is refused); None: any.
    max_pending = models.PositiveIntegerField(null=True, blank=True)
    timeout_seconds = models.PositiveIntegerField(null=True, blank=True)
    # False when the code defining it is no longer loaded: kept for its runs' history.
    is_loaded = models.BooleanField(default=True)

    def __str__(self) -> str:
        return self.name


class Run(TimeStampedModel):
    """One execution of a pipeline: a recoverable process whose record roots its tree."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    pipeline = models.ForeignKey(Pipeline, on_delete=models.PROTECT, related_name="runs")
    number = models.PositiveIntegerField(help_text="per-pipeline sequence number")
    record = models.ForeignKey(
        "records.Record", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_constraint=False
    )
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED)
    # The pipeline's namespace when the run started (kept here: lists filter on it).
    namespace = models.CharField(max_length=63, default="default", db_index=True)
    inputs = models.JSONField(default=dict)
    outputs = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    # Execution lease: the worker holding ``lease_token`` may write the journal until expiry.
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=0)
    # Why it is suspended: records it waits on and/or a timer.
    waiting_on = models.JSONField(default=list, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL)
    # Child runs (ctx.run / ctx.run_all): the parent owns them; they die with it. ``group`` is
    # the parent's journal sequence number of the run_all, ``group_index`` the input's index.
    parent_run = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="children")
    group = models.PositiveIntegerField(null=True, blank=True)
    group_index = models.PositiveIntegerField(null=True, blank=True)
    # The start's idempotency key (a client's ``Idempotency-Key``, or one derived from the cause
    # of a child run): a second start of the pipeline with it returns this run.
    # NULL, not "": runs started without a key are outside the unique constraint.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pipeline", "number"], name="run_unique_number"),
            models.UniqueConstraint(
                fields=["pipeline", "idempotency_key"],
                name="run_unique_idempotency_key",
                condition=Q(idempotency_key__isnull=False),
            ),
        ]
        indexes = [
            models.Index(fields=["status", "created_at"], name="run_status_created"),
            # Lease sweeper: only running runs carry a lease.
            models.Index(fields=["lease_expires_at"], name="run_lease", condition=Q(status="running")),
            # Timer sweeper: only suspended runs with a timer.
            models.Index(fields=["wake_at"], name="run_timer", condition=Q(status="suspended")),
            models.Index(
                fields=["deadline_at"],
                name="run_deadline",
                condition=Q(status__in=["queued", "running", "suspended"]),
            ),
            models.Index(fields=["pipeline", "status", "number"], name="run_pipeline_turn"),
            models.Index(fields=["parent_run", "group", "status"], name="run_children"),
        ]

    def __str__(self) -> str:
        return f"{self.pipeline.name}#{self.number}"


class RunEvent(models.Model):
    """Append-only history of a run's status: each move, why, and who made it (``actor``;
    none when the system did: a worker, a wake-up, the recovery scan)."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    # Empty for the run's creation (its first status).
    from_status = models.CharField(max_length=20, choices=RunStatus.choices, blank=True)
    to_status = models.CharField(max_length=20, choices=RunStatus.choices)
    reason = models.CharField(max_length=80)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["run", "id"], name="runevent_run_id")]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.from_status or '-'} → {self.to_status} ({self.reason})"


class RunWait(models.Model):
    """A suspended run waits for this record (or child run) to settle: found by id on change."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="waits")
    target = models.UUIDField(db_index=True, help_text="a record id or a child run id")

    def __str__(self) -> str:
        return f"{self.run_id} waits for {self.target}"


class JournalEntry(models.Model):
    """One SDK call of a run, keyed by its sequence number and call name (I5)."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="journal")
    seq = models.PositiveIntegerField()
    call = models.CharField(max_length=400)
    status = models.CharField(max_length=12, choices=EntryStatus.choices)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="journal_unique_seq")]
        indexes = [
            # Which runs attached an artifact (the Studio's artifact page): the attached id.
            models.Index(
                KeyTextTransform("id", "result"),
                name="journal_attached_artifact",
                condition=Q(call__startswith=ATTACH_ARTIFACT_CALL),
            )
        ]
        ordering = ["run", "seq"]

    def __str__(self) -> str:
        return f"#{self.seq} {self.call}"
