"""The control plane's own metrics: counters and histograms observed where work happens, added
up across processes in PostgreSQL, and gauges read from the database and the broker when
Prometheus scrapes ``/metrics``.

Why the database and not ``prometheus_client``'s multiprocess mode: the work is done by
Celery worker processes, usually on other hosts than the web process that answers the
scrape. Multiprocess mode shares files in one directory, so it only adds up processes of one
host. Here every process keeps what it observed in memory and adds it to ``MetricTotal``
rows every ``GRAPHENE_METRICS_FLUSH_SECONDS`` (one upsert statement, off the hot path, in a
background thread); a scrape reads those rows. The totals survive restarts (a counter never
goes back), and a process killed with SIGKILL loses at most its last interval.

Histograms are stored per bucket (not cumulated) with ``le`` naming the bucket's upper
bound; the scrape cumulates them.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import json
import logging
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

INF = math.inf

# --- definitions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counter:
    name: str  # without the ``_total`` suffix, as prometheus_client names counter families
    help: str
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class Histogram:
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = field(default=())


_LATENCY = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
_RUN = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)

CONVERGENCE_SECONDS = Histogram(
    "graphene_convergence_seconds",
    "Time from a record's declaration to ready (first convergence), by kind.",
    ("kind",),
    _LATENCY,
)
DELETION_SECONDS = Histogram(
    "graphene_deletion_seconds",
    "Time from a record's deletion request to deleted, by kind.",
    ("kind",),
    _LATENCY,
)
RUN_DURATION_SECONDS = Histogram(
    "graphene_run_duration_seconds",
    "Time from a run's first start to its end (suspensions included), for runs the engine ended.",
    ("pipeline", "status"),
    _RUN,
)
CONVERGE_FAILURES = Counter(
    "graphene_convergence_failures", "Failed create/update attempts (each retry counts), by kind.", ("kind",)
)
DELETE_FAILURES = Counter(
    "graphene_deletion_failures", "Failed delete attempts (each retry counts), by kind.", ("kind",)
)
AGENT_COMMANDS = Counter(
    "graphene_agent_commands", "Agent commands that ended, by kind and status.", ("kind", "status")
)
# Every installed kind is exported for these two, at zero until something drifts.
DRIFT_DETECTED = Counter("graphene_drift_detected", "Records found drifted by observation, by kind.", ("kind",))
DRIFT_HEALED = Counter("graphene_drift_healed", "Drifted records brought back to their spec, by kind.", ("kind",))
SUBSCRIBER_FAILURES = Counter(
    "graphene_subscriber_failures",
    "Domain-event subscribers that raised (logged; the emitter's work is unaffected), by event and subscriber.",
    ("event", "subscriber"),
)

COUNTERS = (CONVERGE_FAILURES, DELETE_FAILURES, AGENT_COMMANDS, DRIFT_DETECTED, DRIFT_HEALED, SUBSCRIBER_FAILURES)
HISTOGRAMS = (CONVERGENCE_SECONDS, DELETION_SECONDS, RUN_DURATION_SECONDS)
# Counters whose label ``kind`` is pre-filled with every installed kind, so they exist at 0.
_ZERO_BY_KIND = (CONVERGE_FAILURES, DELETE_FAILURES, DRIFT_DETECTED, DRIFT_HEALED)


def _labels_key(labels: dict[str, str]) -> str:
    return json.dumps(labels, sort_keys=True, separators=(",", ":")) if labels else ""


def _le(bound: float) -> str:
    return "+Inf" if bound == INF else repr(float(bound))


# --- recording (any process) ------------------------------------------------------------------


class _Pending:
    """What this process observed since its last flush, and the thread that flushes it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[tuple[str, str], float] = {}
        self.thread: threading.Thread | None = None
        self.wake = threading.Event()

    def add(self, items: Iterable[tuple[str, dict[str, str], float]]) -> None:
        with self.lock:
            for name, labels, amount in items:
                key = (name, _labels_key(labels))
                self.values[key] = self.values.get(key, 0.0) + amount
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="graphene-metrics", daemon=True)
                self.thread.start()

    def take(self) -> dict[tuple[str, str], float]:
        with self.lock:
            values, self.values = self.values, {}
        return values

    def give_back(self, values: dict[tuple[str, str], float]) -> None:
        with self.lock:
            for key, amount in values.items():
                self.values[key] = self.values.get(key, 0.0) + amount

    def _loop(self) -> None:
        while True:
            self.wake.wait(settings.GRAPHENE_METRICS_FLUSH_SECONDS if _background() else 1.0)
            self.wake.clear()
            if not _background():
                continue
            try:
                flush()
            except Exception:  # flush() logged it and kept the values for the next round
                logger.debug("metrics flush failed; retrying in the next round")
            finally:
                # A connection per flush (every few seconds at most, only when there is
                # something to add) rather than one more idle session per worker process.
                connection.close()


_pending = _Pending()


def _background() -> bool:
    """``GRAPHENE_METRICS_FLUSH_MS=0`` turns the background flush off: this process's values
    are then added by ``flush()`` calls only (a scrape, the end of the process)."""
    return bool(settings.GRAPHENE_METRICS_FLUSH_SECONDS > 0)


def _after_fork_in_child() -> None:
    # A forked worker inherits the parent's unflushed values and no thread: start afresh, or
    # the parent's observations would be counted twice.
    global _pending
    _pending = _Pending()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _check(metric: Counter | Histogram, labels: dict[str, str]) -> dict[str, str]:
    if set(labels) != set(metric.labels):
        raise ValueError(f"{metric.name} takes labels {metric.labels}, not {tuple(labels)}")
    return {k: str(v) for k, v in labels.items()}


def inc(counter: Counter, amount: float = 1.0, **labels: str) -> None:
    """Add ``amount`` to a counter (in memory; added to the shared total within seconds)."""
    _pending.add([(f"{counter.name}_total", _check(counter, labels), amount)])


def observe_many(histogram: Histogram, values: Sequence[float], **labels: str) -> None:
    """Observe ``values`` (seconds, say) in a histogram, all with the same labels."""
    if not values:
        return
    clean = _check(histogram, labels)
    items: list[tuple[str, dict[str, str], float]] = []
    for value in values:
        index = bisect.bisect_left(histogram.buckets, value)
        bound = histogram.buckets[index] if index < len(histogram.buckets) else INF
        items.append((f"{histogram.name}_bucket", {**clean, "le": _le(bound)}, 1.0))
    items.append((f"{histogram.name}_sum", clean, float(sum(values))))
    items.append((f"{histogram.name}_count", clean, float(len(values))))
    _pending.add(items)


def observe(histogram: Histogram, value: float, **labels: str) -> None:
    observe_many(histogram, [value], **labels)


_UPSERT = (
    "INSERT INTO observability_metrictotal (name, labels, value, updated_at) VALUES {values} "
    "ON CONFLICT (name, labels) DO UPDATE "
    "SET value = observability_metrictotal.value + excluded.value, updated_at = excluded.updated_at"
)


def flush(*, log_errors: bool = True) -> int:
    """Add this process's observations to the shared totals now; returns how many samples.

    One statement; rows in a fixed order so that two processes flushing at once cannot
    deadlock. On a database error the values are kept for the next flush.
    """
    values = _pending.take()
    if not values:
        return 0
    rows = sorted(values.items())
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    params: list[Any] = []
    for (name, labels), amount in rows:
        params.extend([name, labels, amount, now])
    sql = _UPSERT.format(values=", ".join(["(%s, %s, %s, %s)"] * len(rows)))
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
    except Exception:
        if log_errors:
            logger.warning("could not add %d metric sample(s) to the totals; keeping them", len(rows), exc_info=True)
        _pending.give_back(values)
        raise
    return len(rows)


def _flush_at_exit() -> None:
    # Logging may be shut down and the database gone at interpreter exit: best effort, quietly.
    with contextlib.suppress(Exception):
        flush(log_errors=False)


atexit.register(_flush_at_exit)


# --- exposition (the web process) -------------------------------------------------------------


def _queue_names() -> list[str]:
    names = {settings.CELERY_TASK_DEFAULT_QUEUE}
    for route in (getattr(settings, "CELERY_TASK_ROUTES", None) or {}).values():
        if isinstance(route, dict) and route.get("queue"):
            names.add(str(route["queue"]))
    return sorted(names)


_redis_client: Any = None


def _redis() -> Any:
    global _redis_client
    if _redis_client is None:
        import redis

        _redis_client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=1.0, socket_connect_timeout=1.0)
    return _redis_client


# kombu's Redis transport keeps a queue's messages of priority > 0 in lists named
# ``<queue>\x06\x16<priority>`` next to ``<queue>``.
_PRIORITY_SEP = "\x06\x16"
_PRIORITIES = (3, 6, 9)


def queue_depths() -> dict[str, int] | None:
    """Messages waiting in each Celery queue (Redis LLEN); None if the broker is not Redis."""
    if not str(settings.CELERY_BROKER_URL).startswith(("redis://", "rediss://", "unix://")):
        return None
    client = _redis()
    names = _queue_names()
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.llen(name)
        for priority in _PRIORITIES:
            pipe.llen(f"{name}{_PRIORITY_SEP}{priority}")
    lengths = pipe.execute()
    per = 1 + len(_PRIORITIES)
    return {name: int(sum(lengths[i * per : (i + 1) * per])) for i, name in enumerate(names)}


def _family(name: str, help: str, typ: str) -> Metric:
    return Metric(name, help, typ)


# Gauges of the apps above this one (runs, agents), read at scrape time: each app registers
# a function yielding its metric families from its ``AppConfig.ready()``.
GaugeSource = Callable[[], Iterable[Metric]]
_gauge_sources: list[GaugeSource] = []


def gauges_register(source: GaugeSource) -> None:
    """Add ``source``'s families to every scrape (after the records' gauge). Idempotent."""
    if source not in _gauge_sources:
        _gauge_sources.append(source)


def gauge(name: str, help: str) -> Metric:
    """A new gauge family, for gauge sources."""
    return _family(name, help, "gauge")


class GrapheneCollector(Collector):
    """Reads the database (and the broker) at scrape time. Every query is a GROUP BY over an
    index or a read of a small table: the cost does not grow with the number of records
    beyond an index scan."""

    def collect(self) -> Iterator[Metric]:
        from apps.observability.models import MetricTotal
        from apps.records.models import Record
        from kinds import registry

        # The web process's own observations (embedded mode does all work here) first.
        try:
            flush()
        except Exception:  # flush() logged it; the scrape still answers with what is stored
            logger.debug("metrics flush before a scrape failed")

        records = _family("graphene_records", "Records by kind and phase (tombstones included).", "gauge")
        # order_by(): the tree manager orders by (tree_id, lft), which would split the groups.
        for row in Record.objects.order_by().values("kind", "phase").annotate(n=Count("pk")):
            records.add_sample("graphene_records", {"kind": row["kind"], "phase": row["phase"]}, row["n"])
        yield records
        for source in _gauge_sources:
            yield from source()

        up = _family("graphene_broker_up", "1 if the broker answered this scrape (Redis only).", "gauge")
        depth = _family("graphene_queue_depth", "Messages waiting in each Celery queue (Redis LLEN).", "gauge")
        try:
            depths = queue_depths()
        except Exception as exc:
            logger.warning("metrics: the broker did not answer: %s", exc)
            up.add_sample("graphene_broker_up", {}, 0)
        else:
            if depths is not None:
                up.add_sample("graphene_broker_up", {}, 1)
                for queue, n in depths.items():
                    depth.add_sample("graphene_queue_depth", {"queue": queue}, n)
        yield up
        yield depth

        totals: dict[str, list[tuple[dict[str, str], float]]] = {}
        for name, key, value in MetricTotal.objects.values_list("name", "labels", "value"):
            totals.setdefault(name, []).append((json.loads(key) if key else {}, value))
        kinds = sorted(registry())
        for counter in COUNTERS:
            yield self._counter(counter, totals, kinds if counter in _ZERO_BY_KIND else [])
        for histogram in HISTOGRAMS:
            yield self._histogram(histogram, totals)

    @staticmethod
    def _counter(counter: Counter, totals: dict[str, list[tuple[dict[str, str], float]]], kinds: list[str]) -> Metric:
        family = Metric(counter.name, counter.help, "counter")
        sample = f"{counter.name}_total"
        seen: dict[str, float] = {kind: 0.0 for kind in kinds}
        for labels, value in totals.get(sample, []):
            if labels.keys() == {"kind"}:
                seen[labels["kind"]] = value
            else:
                family.add_sample(sample, labels, value)
        for kind, value in sorted(seen.items()):
            family.add_sample(sample, {"kind": kind}, value)
        return family

    @staticmethod
    def _histogram(histogram: Histogram, totals: dict[str, list[tuple[dict[str, str], float]]]) -> Metric:
        family = Metric(histogram.name, histogram.help, "histogram")
        bounds = [*histogram.buckets, INF]
        series: dict[str, dict[str, Any]] = {}
        for labels, value in totals.get(f"{histogram.name}_bucket", []):
            le = labels.pop("le", "+Inf")
            entry = series.setdefault(_labels_key(labels), {"labels": labels, "buckets": {}})
            entry["buckets"][le] = entry["buckets"].get(le, 0.0) + value
        sums = {_labels_key(labels): value for labels, value in totals.get(f"{histogram.name}_sum", [])}
        counts = {_labels_key(labels): value for labels, value in totals.get(f"{histogram.name}_count", [])}
        for key in sorted(series):
            labels = series[key]["labels"]
            running = 0.0
            for bound in bounds:
                running += series[key]["buckets"].get(_le(bound), 0.0)
                family.add_sample(f"{histogram.name}_bucket", {**labels, "le": _le(bound)}, running)
            family.add_sample(f"{histogram.name}_count", labels, counts.get(key, running))
            family.add_sample(f"{histogram.name}_sum", labels, sums.get(key, 0.0))
        return family


def registry() -> CollectorRegistry:
    """The registry ``/metrics`` exposes: Graphene's collector and the web process's own."""
    global _registry
    if _registry is None:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(GrapheneCollector())
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)
        _registry = reg
    return _registry


_registry: CollectorRegistry | None = None
