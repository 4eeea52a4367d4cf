"""Where a record's object lives (its kind's ``placement`` fields), and what is left at the
place it moved away from until the object there is removed."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.utils import timezone

from apps.records.choices import Phase
from apps.records.models import Record
from kinds import UnknownKind, get_kind


def _place(kind: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Where a spec puts the object (its kind's ``placement`` fields)."""
    try:
        placement = get_kind(kind).placement
    except UnknownKind:
        placement = ()
    return {field: spec.get(field) for field in placement}


def _moved_from(record: Record, spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """What ``moved_from`` becomes when ``record`` is re-declared with ``spec``: the old spec
    and when the move began (the removal's deadline on a lost machine counts from then)."""
    new = _place(record.kind, spec)
    if not new:
        return None
    if record.moved_from is not None:  # not removed from the first place yet: it is still there
        return None if _place(record.kind, record.moved_from["spec"]) == new else record.moved_from
    if _place(record.kind, record.spec) == new or (record.phase == Phase.PENDING and record.attempts == 0):
        return None  # the same place, or nothing was made yet
    return {"spec": record.spec, "since": timezone.now().isoformat()}


def _left_behind(record: Record) -> Record | None:
    """The record as it was at the place it moved away from (``delete`` removes the object
    there), or ``None``. Its deletion counts from the move (deadlines on lost machines)."""
    if record.moved_from is None:
        return None
    old = copy.copy(record)
    old.spec = record.moved_from["spec"]
    old.deletion_requested_at = datetime.fromisoformat(record.moved_from["since"])
    return old


def _place_text(place: Mapping[str, Any]) -> str:
    return ", ".join(f"{key} {value if value is not None else '(none)'}" for key, value in place.items())
