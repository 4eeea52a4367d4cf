"""Celery entry points for records: ids in, one service call, retries here.

Database errors (a deadlock between two batches, a restarted server) are retried with
backoff; if a message is lost anyway, the reconciler finds the record by its lease.
"""

from __future__ import annotations

from celery import shared_task
from django.db import DatabaseError

from apps.records import services

RETRY_ON = (DatabaseError,)


@shared_task(acks_late=True, autoretry_for=RETRY_ON, retry_backoff=1, retry_backoff_max=30, max_retries=8)
def record_converge_task(record_id: str) -> None:
    services.record_converge(record_id=record_id)


@shared_task(acks_late=True, autoretry_for=RETRY_ON, retry_backoff=1, retry_backoff_max=30, max_retries=8)
def records_delete_task(record_ids: list[str]) -> None:
    services.record_delete_batch(record_ids=record_ids)


@shared_task(acks_late=True, autoretry_for=RETRY_ON, retry_backoff=1, retry_backoff_max=30, max_retries=3)
def records_expire_task() -> int:
    return services.records_expire()


@shared_task(acks_late=True, autoretry_for=RETRY_ON, retry_backoff=1, retry_backoff_max=30, max_retries=3)
def records_reconcile_task() -> int:
    return services.records_reconcile()


@shared_task(acks_late=True)
def records_purge_task() -> int:
    return services.records_purge()


@shared_task(acks_late=True)
def records_sweep_task() -> int:
    return len(services.records_sweep())


@shared_task(acks_late=True, autoretry_for=RETRY_ON, retry_backoff=1, retry_backoff_max=30, max_retries=3)
def records_observe_due_task() -> int:
    return services.records_observe_due()


@shared_task(acks_late=True, autoretry_for=RETRY_ON, retry_backoff=1, retry_backoff_max=30, max_retries=3)
def records_observe_task(record_ids: list[str]) -> dict[str, int]:
    return services.records_observe(record_ids=record_ids)
