"""Reads shared by every app."""

from __future__ import annotations

import uuid
from typing import Any, TypeVar

from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Model, QuerySet

from apps.core.errors import NotFound

M = TypeVar("M", bound=Model)


def get_by_uuid(queryset: QuerySet[M], raw_id: Any, *, noun: str) -> M:
    """One row of ``queryset`` by its UUID primary key; ``NotFound`` (404) saying why if not."""
    try:
        pk = uuid.UUID(str(raw_id))
    except ValueError:
        raise NotFound(f"no {noun} {raw_id!r}: {noun} ids are UUIDs") from None
    try:
        return queryset.get(pk=pk)
    except ObjectDoesNotExist:
        raise NotFound(f"no {noun} {raw_id}") from None
