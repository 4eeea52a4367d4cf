"""Celery entry points of the core app: thin, they call one function; retries here."""

from __future__ import annotations

from celery import shared_task
from django.db import DatabaseError


@shared_task(acks_late=True, autoretry_for=(DatabaseError,), retry_backoff=1, retry_backoff_max=30, max_retries=3)
def audit_prune_task() -> int:
    """Beat, hourly: delete audit rows older than GRAPHENE_AUDIT_RETENTION_DAYS."""
    from apps.core.audit import audit_prune

    return audit_prune()
