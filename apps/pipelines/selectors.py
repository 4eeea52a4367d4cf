"""Reads of pipelines and runs (all authenticated users see all, for now: one choke point)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from apps.core.errors import ValidationFailed
from apps.core.selectors import get_by_uuid
from apps.pipelines.choices import RunStatus
from apps.pipelines.models import JournalEntry, Pipeline, Run

User = AbstractBaseUser | AnonymousUser


def run_visible(*, user: User) -> QuerySet[Run]:
    if not user.is_authenticated:
        return Run.objects.none()
    return Run.objects.select_related("pipeline")


def run_get(*, user: User, run_id: Any) -> Run:
    return get_by_uuid(run_visible(user=user), run_id, noun="run")


def run_list(*, user: User, pipeline: str | None = None, statuses: list[str] | None = None) -> QuerySet[Run]:
    qs = run_visible(user=user)
    if pipeline:
        qs = qs.filter(pipeline__name=pipeline)
    if statuses:
        unknown = sorted(set(statuses) - set(RunStatus.values))
        if unknown:
            raise ValidationFailed(
                f"unknown status {unknown}; statuses are {RunStatus.values}", fields={"status": unknown}
            )
        qs = qs.filter(status__in=statuses)
    return qs


def run_journal(*, run: Run, limit: int) -> list[JournalEntry]:
    return list(JournalEntry.objects.filter(run=run).order_by("seq")[:limit])


def pipeline_list() -> QuerySet[Pipeline]:
    return Pipeline.objects.filter(is_loaded=True).order_by("name")
