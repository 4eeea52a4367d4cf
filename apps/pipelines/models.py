"""Pipelines, runs and their journals."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.fields.json import KeyTextTransform

from apps.core.models import TimeStampedModel
from apps.pipelines.choices import ATTACH_ARTIFACT_CALL, EntryStatus, FiringStatus, RunStatus, TriggerType


class Source(TimeStampedModel):
    """Where a namespace's pipeline code comes from: a git repository at a ref (``sync`` makes a
    revision of each new commit), or, without a URL, the directories pushed to it."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    namespace = models.CharField(max_length=63, default="default")
    name = models.CharField(max_length=100)
    url = models.CharField(max_length=1000, blank=True, help_text="a git repository; empty: pushed directories")
    ref = models.CharField(max_length=255, blank=True, help_text="a branch, a tag or a commit")
    subdirectory = models.CharField(max_length=500, blank=True)
    credential = models.CharField(max_length=253, blank=True, help_text="the name of a secret of the namespace")
    # Whether a new revision's pipelines become active at once (else: graphenectl pipeline activate).
    activate = models.BooleanField(default=True)
    commit = models.CharField(max_length=40, blank=True, help_text="the commit last synced")
    revision = models.ForeignKey(
        "Revision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", help_text="the latest"
    )
    synced_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, help_text="why the last sync or push was refused; empty after one that worked")
    error_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="source_unique_name")]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class Revision(models.Model):
    """Immutable pipeline code: a canonical archive of a source tree in the blob store (by its
    sha256), with the manifest its import produced. The same files twice are one revision."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    namespace = models.CharField(max_length=63, default="default")
    digest = models.CharField(max_length=64, help_text="sha256 of the canonical archive (its blob)")
    size = models.BigIntegerField(help_text="the archive's bytes")
    source = models.ForeignKey(Source, null=True, blank=True, on_delete=models.SET_NULL, related_name="revisions")
    commit = models.CharField(max_length=40, blank=True, help_text="the git commit it was made from")
    # {"pipelines": [{name, namespace, source, description, input_schema, output_schema,
    # concurrency, max_pending, timeout_seconds, triggers}], "modules": [...]}
    manifest = models.JSONField(default=dict)
    created_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "digest"], name="revision_unique_digest")]
        indexes = [models.Index(fields=["namespace", "created_at", "id"], name="revision_namespace_newest")]

    def __str__(self) -> str:
        return self.short

    @property
    def short(self) -> str:
        """The digest's first 12 digits, as lists show it."""
        return self.digest[:12]

    def pipeline_names(self) -> list[str]:
        return [p["name"] for p in self.manifest.get("pipelines", [])]


class Pipeline(TimeStampedModel):
    """A pipeline definition as last loaded from code: name, schemas, policies. A pipeline
    delivered as revisions names its active one (what new runs start on); one installed on the
    workers (``GRAPHENE_PIPELINE_MODULES``) has none."""

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
    revision = models.ForeignKey(
        Revision, null=True, blank=True, on_delete=models.PROTECT, related_name="+", help_text="the active revision"
    )
    # The triggers' specs as last reconciled (graphene_sdk._triggers ``spec()``): what the code
    # declares is compared with this, so unchanged code costs no read of the triggers.
    trigger_specs = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return self.name


class PipelineEvent(models.Model):
    """Append-only history of a pipeline's delivery: each activation (and rollback), by whom."""

    id = models.BigAutoField(primary_key=True)
    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="events")
    reason = models.CharField(max_length=80)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["pipeline", "id"], name="pipelineevent_pipeline_id")]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.pipeline_id}: {self.reason}"


class Trigger(TimeStampedModel):
    """What starts a pipeline's runs without a person: a run of an upstream pipeline ending, a
    cron instant, a signed webhook delivery. Declared in the pipeline's code and reconciled
    when it is activated (apps/pipelines/triggers.py); paused and resumed by people."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="triggers")
    namespace = models.CharField(max_length=63, default="default")
    name = models.CharField(max_length=100)
    type = models.CharField(max_length=20, choices=TriggerType.choices)
    spec = models.JSONField(default=dict, help_text="as declared: graphene_sdk._triggers spec()")
    # upstream: the pipeline whose runs' ends fire it (indexed: looked up as each run ends).
    upstream = models.CharField(max_length=200, blank=True)
    # cron: the next scheduled instant (what the scheduler fires next).
    next_fire_at = models.DateTimeField(null=True, blank=True)
    paused = models.BooleanField(default=False)
    paused_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    paused_at = models.DateTimeField(null=True, blank=True)
    last_fired_at = models.DateTimeField(null=True, blank=True)
    last_run = models.ForeignKey("Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pipeline", "name"], name="trigger_unique_name")]
        indexes = [
            models.Index(fields=["upstream", "namespace"], name="trigger_upstream", condition=Q(type="upstream")),
            models.Index(fields=["next_fire_at"], name="trigger_cron_due", condition=Q(type="cron")),
            models.Index(fields=["namespace", "pipeline", "name"], name="trigger_namespace"),
        ]

    def __str__(self) -> str:
        return f"{self.pipeline.name}/{self.name}"


class TriggerEvent(models.Model):
    """Append-only history of a trigger: each firing, skip, missed instant, refused delivery,
    pause and resume."""

    id = models.BigAutoField(primary_key=True)
    trigger = models.ForeignKey(Trigger, on_delete=models.CASCADE, related_name="events")
    reason = models.CharField(max_length=80)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    run = models.ForeignKey("Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["trigger", "id"], name="triggerevent_trigger_id")]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.trigger_id}: {self.reason}"


class TriggerFiring(models.Model):
    """One cause a trigger fired for (an upstream run's end, a cron instant, a webhook
    delivery), written in the transaction that saw it: the run starts from it, once
    (``key`` is unique per trigger), even if the process that wrote it dies first."""

    id = models.BigAutoField(primary_key=True)
    trigger = models.ForeignKey(Trigger, on_delete=models.CASCADE, related_name="firings")
    key = models.CharField(max_length=255, help_text="the upstream run's id, the cron instant, the delivery id")
    cause = models.JSONField(default=dict)
    payload = models.JSONField(null=True, blank=True, help_text="a webhook delivery's body")
    status = models.CharField(max_length=12, choices=FiringStatus.choices, default=FiringStatus.PENDING)
    run = models.ForeignKey("Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["trigger", "key"], name="firing_unique_key")]
        indexes = [models.Index(fields=["created_at"], name="firing_pending", condition=Q(status="pending"))]

    def __str__(self) -> str:
        return f"{self.trigger_id}: {self.key}"


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
    namespace = models.CharField(max_length=63, default="default")  # indexed with created_at (Meta)
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
    # The code it runs and replays, always (None: the pipeline's code installed on the workers).
    revision = models.ForeignKey(Revision, null=True, blank=True, on_delete=models.PROTECT, related_name="runs")
    # Why it started (apps/pipelines/causes.py): {"type": "user"|"parent"|"upstream"|"cron"|
    # "webhook", ...}; and the trigger that started it, if one did.
    cause = models.JSONField(default=dict, blank=True)
    trigger = models.ForeignKey(Trigger, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs")

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
            # Newest-first lists narrowed to the namespaces a user may read (apps/core/access.py).
            models.Index(fields=["namespace", "created_at", "id"], name="run_namespace_newest"),
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
