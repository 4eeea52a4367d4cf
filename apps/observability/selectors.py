"""Reads of logs: a record's lines, or a whole subtree's (a run's view includes its records')."""

from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet

from apps.core.errors import ValidationFailed
from apps.observability.models import LogLine
from apps.observability.services import SEVERITIES
from apps.records.models import Record


def log_lines(
    *,
    record: Record,
    include_descendants: bool = True,
    grep: str | None = None,
    min_severity: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[LogLine]:
    if include_descendants and not record.is_leaf_node():
        # The subtree's ids first (an index range on the tree), then its lines through the
        # (record, id) index: as one join the planner may scan the whole table instead.
        subtree = Record.objects.filter(tree_id=record.tree_id, lft__gte=record.lft, rght__lte=record.rght)
        qs = LogLine.objects.filter(record_id__in=list(subtree.values_list("pk", flat=True)))
    else:
        qs = LogLine.objects.filter(record=record)
    if grep:
        qs = qs.filter(message__icontains=grep)
    if min_severity:
        if min_severity not in SEVERITIES:
            raise ValidationFailed(f"severity must be one of {list(SEVERITIES)}", fields={"severity": [min_severity]})
        qs = qs.filter(severity__in=SEVERITIES[SEVERITIES.index(min_severity) :])
    if since:
        qs = qs.filter(at__gte=since)
    if until:
        qs = qs.filter(at__lt=until)
    return qs.select_related("record").order_by("id")
