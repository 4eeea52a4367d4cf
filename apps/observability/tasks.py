"""Celery entry points for observability: ids in (none here), one service call."""

from __future__ import annotations

from celery import shared_task
from django.db import DatabaseError

from apps.observability import services


@shared_task(acks_late=True, autoretry_for=(DatabaseError,), retry_backoff=1, max_retries=3)
def observability_purge_task() -> dict[str, int]:
    return services.observability_purge()


@shared_task(acks_late=True, autoretry_for=(DatabaseError,), retry_backoff=1, max_retries=3)
def logs_trim_task() -> dict[str, int]:
    return services.logs_trim()
