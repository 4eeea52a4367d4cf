"""Retrying a request that is safe to repeat: a start with an idempotency key, a read.

Connection errors, timeouts and 5xx answers are retried with exponential backoff and jitter;
everything else (a 4xx: the request itself is wrong) is raised at once. A start is safe to
repeat only with the same ``Idempotency-Key``: the server answers a repeated start with the
run the first one made.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Seconds before each retry (before jitter): five retries, about 8 s in all, then the error.
RETRY_DELAYS: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0, 4.0)
IDEMPOTENCY_HEADER = "Idempotency-Key"


def new_idempotency_key() -> str:
    """A fresh key for one logical start (its retries reuse it)."""
    return str(uuid.uuid4())


def retrying(
    call: Callable[[], T],
    *,
    retryable: Callable[[Exception], bool],
    delays: tuple[float, ...] = RETRY_DELAYS,
    on_retry: Callable[[int, float, Exception], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``, again after each delay while it raises a ``retryable`` error."""
    for attempt, delay in enumerate((*delays, None), start=1):
        try:
            return call()
        except Exception as exc:
            if delay is None or not retryable(exc):
                raise
            wait = delay + random.uniform(0, delay / 2)  # noqa: S311 - jitter, not a secret
            if on_retry is not None:
                on_retry(attempt, wait, exc)
            sleep(wait)
    raise AssertionError("unreachable")  # the last attempt returned or raised
