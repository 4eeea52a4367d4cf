"""Celery entry points for runs: ids in, one service call."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import DatabaseError

from apps.pipelines import engine, services
from apps.pipelines.services import triggers


@shared_task(acks_late=True, autoretry_for=(DatabaseError,), retry_backoff=1, retry_backoff_max=30, max_retries=8)
def run_execute_task(run_id: str) -> None:
    engine.run_execute(run_id=run_id)


@shared_task(acks_late=True, autoretry_for=(DatabaseError,), retry_backoff=1, max_retries=3)
def runs_recover_task() -> dict[str, Any]:
    return services.runs_recover()


@shared_task(acks_late=True, autoretry_for=(DatabaseError,), retry_backoff=1, retry_backoff_max=10, max_retries=8)
def trigger_firing_task(firing_id: int) -> None:
    triggers.firing_process(firing_id)


@shared_task(acks_late=True, autoretry_for=(DatabaseError,), retry_backoff=1, max_retries=3)
def trigger_cron_fire_task(trigger_id: str) -> None:
    triggers.cron_fire(trigger_id)


@shared_task(acks_late=True, autoretry_for=(DatabaseError,), retry_backoff=1, max_retries=3)
def triggers_tick_task() -> dict[str, int]:
    return triggers.triggers_tick()
