"""Celery entry points for agents: one service call each, retries here."""

from __future__ import annotations

from celery import shared_task
from django.db import DatabaseError

from apps.agents import services


@shared_task(acks_late=True, autoretry_for=(DatabaseError,), retry_backoff=1, retry_backoff_max=30, max_retries=3)
def agents_mark_lost_task() -> int:
    return services.agents_mark_lost()
