"""Log lines per record (a run's log is its record's lines)."""

from django.db import models


class LogLine(models.Model):
    """One line of a record's log: what a run, step, command or container wrote."""

    id = models.BigAutoField(primary_key=True)
    record = models.ForeignKey("records.Record", on_delete=models.CASCADE, related_name="log_lines")
    at = models.DateTimeField()
    stream = models.CharField(max_length=16, default="stdout")
    severity = models.CharField(max_length=16, default="info")
    source = models.CharField(max_length=120, blank=True)
    message = models.TextField()

    class Meta:
        indexes = [models.Index(fields=["record", "id"], name="logline_record_id")]

    def __str__(self) -> str:
        return self.message[:80]
