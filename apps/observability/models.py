"""Observability data per record: log lines, metric samples, spans; and the shared totals
behind the control plane's own Prometheus counters and histograms.

Spans and metric points refer to records by id. Spans keep no database constraint on the
record (they are written in batches on hot paths, outlive nothing and are purged by age);
metric points, like log lines, go with their record when its tombstone is purged.
"""

from django.db import models


class LogLine(models.Model):
    """One line of a record's log: what a run, step, command or container wrote."""

    id = models.BigAutoField(primary_key=True)
    # No database constraint and no index of its own (the (record, id) index serves every
    # lookup by record): an agent's output is stored at tens of thousands of lines a second, and
    # the per-row foreign key check and the extra index were half of PostgreSQL's work per
    # line (bench/agent_logs.py). Lines still go with their record (the ORM's cascade when a
    # tombstone is purged); a line written for a record purged at that moment is removed
    # by the retention, like every line.
    record = models.ForeignKey(
        "records.Record", on_delete=models.CASCADE, related_name="log_lines", db_constraint=False, db_index=False
    )
    at = models.DateTimeField()
    stream = models.CharField(max_length=16, default="stdout")
    severity = models.CharField(max_length=16, default="info")
    source = models.CharField(max_length=120, blank=True)
    message = models.TextField()

    class Meta:
        indexes = [
            models.Index(fields=["record", "id"], name="logline_record_id"),
            models.Index(fields=["at"], name="logline_at"),  # the retention purge
        ]

    def __str__(self) -> str:
        return self.message[:80]


class LogDrop(models.Model):
    """How many lines the log bounds removed from a record's log (too many lines for one
    record, or older than the retention): reported with its logs and as events, never silent."""

    record = models.OneToOneField("records.Record", primary_key=True, on_delete=models.CASCADE, related_name="log_drop")
    lines = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.lines} line(s) dropped from {self.record_id}"


class LogTrimMark(models.Model):
    """Where the per-record bound check stopped: the next one looks only at newer lines."""

    name = models.CharField(primary_key=True, max_length=40)
    last_id = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} checked up to line {self.last_id}"


class MetricPoint(models.Model):
    """One sample of a record's named series (e.g. ``step_duration_seconds{step="build"}``).

    A series is (record, name, labels); reads aggregate the points of a window per step.
    """

    id = models.BigAutoField(primary_key=True)
    record = models.ForeignKey("records.Record", on_delete=models.CASCADE, related_name="metric_points")
    name = models.CharField(max_length=200)
    labels = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField()
    value = models.FloatField()

    class Meta:
        indexes = [
            # A series' window: WHERE record_id = ? AND name = ? AND at BETWEEN ...
            models.Index(fields=["record", "name", "at"], name="metricpoint_series"),
            # Retention purge.
            models.Index(fields=["at"], name="metricpoint_at"),
        ]

    def __str__(self) -> str:
        return f"{self.name}{self.labels or ''}={self.value} at {self.at}"


class SpanStatus(models.TextChoices):
    # Nothing was said about the outcome (OpenTelemetry's default; also a cancelled run).
    UNSET = "unset", "Unset"
    # The operation completed successfully.
    OK = "ok", "OK"
    # The operation failed; ``status_message`` says how.
    ERROR = "error", "Error"


class Span(models.Model):
    """One timed operation, shaped like an OpenTelemetry span (hex trace and span ids).

    A run's trace id is derived from the run id, so every execution attempt of the run (a
    replay after a suspension or a crash) adds to the same trace. Attributes never hold
    secret values (I7): names, ids, counts and outcomes only.
    """

    id = models.BigAutoField(primary_key=True)
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    parent_span_id = models.CharField(max_length=16, blank=True)
    name = models.CharField(max_length=200)
    # The record the operation acted on (a converged or deleted record, the run's root for
    # steps, the agent for commands). No constraint: see the module docstring.
    record = models.ForeignKey(
        "records.Record", null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    # The run whose trace this is (None for work no run asked for, e.g. an API declaration).
    run_id = models.UUIDField(null=True, blank=True)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    status = models.CharField(max_length=8, choices=SpanStatus.choices, default=SpanStatus.UNSET)
    status_message = models.TextField(blank=True)
    attributes = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["trace_id", "started_at"], name="span_trace"),
            models.Index(fields=["record", "started_at"], name="span_record"),
            models.Index(fields=["started_at"], name="span_started"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.span_id})"


class MetricTotal(models.Model):
    """The running total of one sample of a control-plane metric, over all processes.

    Counters and histograms are observed in whatever process does the work (Celery workers,
    the web process); each process adds what it observed to these rows every few seconds
    (``apps.observability.metrics``), and ``/metrics`` reads them. ``name`` is the sample's
    name (``graphene_deletion_seconds_bucket``); ``labels`` its labels as canonical JSON.
    """

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200)
    labels = models.CharField(max_length=1000, blank=True)
    value = models.FloatField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["name", "labels"], name="metrictotal_unique_sample")]

    def __str__(self) -> str:
        return f"{self.name}{self.labels}={self.value}"
