"""Reachability checks for the stores Graphene depends on.

Used by ``/readyz`` and by the ``graphene`` command's pre-flight, which turns a failure into
a one-line error naming the setting to fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings


@dataclass(frozen=True)
class Check:
    name: str
    setting: str
    ok: bool
    detail: str


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _pool() -> Any:
    """This process's connection pool (psycopg_pool's ConnectionPool), or None (not pooled)."""
    from django.db import connection

    return getattr(connection, "pool", None)  # SQLite's backend has no pool at all


def check_database(*, timeout: float = 3.0, direct: bool = False) -> Check:
    """The database answers. A pooled process asks through its pool (waiting at most ``timeout``
    for a connection), so the probe never opens a connection beyond the bound; ``direct`` opens
    one of its own instead (the ``graphene`` command's pre-flight, before the pool exists), which
    names the cause of a failure rather than the pool's timeout."""
    from django.db import connection

    pool = _pool()
    if pool is not None and not direct:
        return _check_through_pool(pool, min(timeout, pool.timeout))
    try:
        if pool is not None:
            import psycopg

            # get_connection_params() leaves the pool's options out.
            with psycopg.connect(**connection.get_connection_params()) as conn:
                conn.execute("SELECT 1")
        else:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
                cursor.fetchone()
    except Exception as exc:  # any driver error means "not ready"
        return Check("database", "GRAPHENE_DATABASE_URL", False, _first_line(exc))
    return Check("database", "GRAPHENE_DATABASE_URL", True, connection.vendor)


def _check_through_pool(pool: Any, timeout: float) -> Check:
    from django.db import connection
    from psycopg_pool import PoolTimeout

    def busy() -> Check | None:
        """Every connection the pool has opened is lent to a request (each is checked as it is
        lent): the database answers. The probe does not borrow one then, or it would queue
        behind the requests; and a busy process is not an unready one (with every replica busy,
        a load balancer would be left with none). The pool's state on /readyz says how busy."""
        stats = pool.get_stats()
        if not stats["pool_size"] or stats["pool_available"]:
            return None  # an idle connection to try, or none open yet: the probe borrows one
        in_use = stats["pool_size"] - stats["pool_available"]
        detail = f"{in_use} of {stats['pool_max']} connections in use, {stats['requests_waiting']} requests waiting"
        return Check("database", "GRAPHENE_DATABASE_URL", True, f"{connection.vendor} ({detail})")

    pool.open()  # as Django does on a request's first query
    if found := busy():
        return found
    try:
        with pool.connection(timeout=timeout) as conn:
            conn.execute("SELECT 1")
    except PoolTimeout:
        # Busy meanwhile, or connections could have been opened and were not.
        return busy() or Check(
            "database",
            "GRAPHENE_DATABASE_URL",
            False,
            f"the connection pool opened no connection within {timeout:g}s (is the database reachable?)",
        )
    except Exception as exc:  # any driver error means "not ready"
        return Check("database", "GRAPHENE_DATABASE_URL", False, _first_line(exc))
    return Check("database", "GRAPHENE_DATABASE_URL", True, connection.vendor)


def database_pool() -> dict[str, Any] | None:
    """The state of this process's connection pool (the web's), or None when it has none:
    connections open (``size``) and idle among them (``available``), requests ``waiting`` for
    one now, the bounds, and since start-up the requests served, those that had to queue and
    those that failed (timed out)."""
    pool = _pool()
    if pool is None:
        return None
    stats = pool.get_stats()
    return {
        "size": stats["pool_size"],
        "available": stats["pool_available"],
        "in_use": stats["pool_size"] - stats["pool_available"],
        "waiting": stats["requests_waiting"],
        "min": stats["pool_min"],
        "max": stats["pool_max"],
        "timeout_seconds": pool.timeout,
        "requests": stats.get("requests_num", 0),
        "queued": stats.get("requests_queued", 0),
        "errors": stats.get("requests_errors", 0),
    }


def check_broker(timeout: float = 3.0) -> Check:
    from graphene_project.celery import app

    url = settings.CELERY_BROKER_URL
    if url.startswith("memory://"):
        return Check("broker", "GRAPHENE_BROKER_URL", True, "in-process (embedded)")
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=int(timeout))
    except Exception as exc:
        return Check("broker", "GRAPHENE_BROKER_URL", False, f"{redact(url)}: {_first_line(exc)}")
    return Check("broker", "GRAPHENE_BROKER_URL", True, redact(url))


def check_channel_layer(timeout: float = 3.0) -> Check:
    from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers

    if DEFAULT_CHANNEL_LAYER not in channel_layers.configs:
        return Check("channel_layer", "GRAPHENE_CHANNEL_LAYER_URL", False, "no channel layer configured")
    # A layer of the probe's own, not the process's: closing its pools below must not close
    # the connections the server's loop and the hints' sender are using (channels_redis's
    # close_pools closes those of every event loop the layer has served).
    layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)

    async def roundtrip() -> None:
        channel = await layer.new_channel()
        token = uuid.uuid4().hex
        await layer.send(channel, {"type": "graphene.ping", "token": token})
        message = await layer.receive(channel)
        if message.get("token") != token:
            raise RuntimeError("channel layer returned a different message")

    try:
        asyncio.run(asyncio.wait_for(roundtrip(), timeout))
    except Exception as exc:
        return Check("channel_layer", "GRAPHENE_CHANNEL_LAYER_URL", False, _first_line(exc) or "timed out")
    finally:
        # channels_redis keeps pools per event loop; close the one of the loop asyncio.run made.
        close = getattr(layer, "close_pools", None)
        if close is not None:
            # A failed close must not turn a passing check into a failure.
            with contextlib.suppress(Exception):
                asyncio.run(close())
    return Check("channel_layer", "GRAPHENE_CHANNEL_LAYER_URL", True, type(layer).__name__)


def run_all() -> list[Check]:
    return [check_database(), check_broker(), check_channel_layer()]
