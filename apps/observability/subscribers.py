"""What observability does when other apps' work happens: spans and metrics, as subscribers
of domain events (``apps.core.domain``), subscribed in ``ObservabilityConfig.ready()``.

The apps that do the work (records, agents) name no consumer: they emit an event where the
outcome is known, and these subscribers turn it into spans (written after the emitter's
transaction commits, in one INSERT per event) and metrics (into the process's buffer). A
subscriber that fails is logged and counted by the dispatch; it never touches the work it
describes.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from apps.core import domain
from apps.observability import metrics, tracing
from apps.observability.models import Span, SpanStatus
from apps.observability.tracing import new_span_id


def _span(
    record: domain.RecordRef,
    name: str,
    started_at: datetime,
    ended_at: datetime,
    attributes: dict[str, Any],
    *,
    error: str = "",
) -> Span:
    trace_id, parent, run_id = tracing.record_trace(record)
    return Span(
        trace_id=trace_id,
        span_id=new_span_id(),
        parent_span_id=parent,
        name=name,
        record_id=record.id,
        run_id=run_id,
        started_at=started_at,
        ended_at=ended_at,
        status=SpanStatus.ERROR if error else SpanStatus.OK,
        status_message=tracing.message(error) if error else "",
        attributes={"graphene.kind": record.kind, "graphene.record.name": record.name, **attributes},
    )


def record_converged(event: domain.RecordConverged) -> None:
    """A convergence span; the time to a first creation; a heal counted."""
    record = event.record
    attributes = {
        "graphene.generation": record.generation,
        "graphene.created": event.created,
        "graphene.adopted": event.adopted,
    }
    tracing.spans_write([_span(record, "record_converge", event.started_at, event.ended_at, attributes)])
    if event.created:
        seconds = max((event.ended_at - record.created_at).total_seconds(), 0.0)
        metrics.observe(metrics.CONVERGENCE_SECONDS, seconds, kind=record.kind)
    if event.healed:
        metrics.inc(metrics.DRIFT_HEALED, kind=record.kind)


def record_converge_failed(event: domain.RecordConvergeFailed) -> None:
    """A failed create/update attempt: an error span and a failure counted."""
    record = event.record
    attributes = {"graphene.generation": record.generation, "graphene.attempt": record.attempts + 1}
    span = _span(record, "record_converge", event.started_at, event.ended_at, attributes, error=event.error)
    tracing.spans_write([span])
    metrics.inc(metrics.CONVERGE_FAILURES, kind=record.kind)


def records_deleted(event: domain.RecordsDeleted) -> None:
    """One ``records.delete_batch`` span per trace in the batch (usually one: a batch holds
    part of one run's tree), with a ``record.delete`` child per record; failures counted, the
    time from each deletion request to deleted observed."""
    spans: list[Span] = []
    by_trace: dict[tuple[str, str, str | None], list[domain.RecordRef]] = defaultdict(list)
    for record in event.records:
        by_trace[tracing.record_trace(record)].append(record)
    latencies: dict[str, list[float]] = defaultdict(list)
    for (trace_id, parent, run_id), group in by_trace.items():
        batch_id = new_span_id()
        failures = sum(1 for r in group if event.errors.get(r.id) is not None)
        spans.append(
            Span(
                trace_id=trace_id,
                span_id=batch_id,
                parent_span_id=parent,
                name="records.delete_batch",
                record_id=None,
                run_id=run_id,
                started_at=event.started_at,
                ended_at=event.ended_at,
                status=SpanStatus.ERROR if failures else SpanStatus.OK,
                status_message=f"{failures} of {len(group)} delete(s) failed" if failures else "",
                attributes={"graphene.records": len(group), "graphene.failures": failures},
            )
        )
        for record in group:
            error = event.errors.get(record.id)
            spans.append(
                Span(
                    trace_id=trace_id,
                    span_id=new_span_id(),
                    parent_span_id=batch_id,
                    name="record.delete",
                    record_id=record.id,
                    run_id=run_id,
                    started_at=event.started_at,
                    ended_at=event.ended_at,
                    status=SpanStatus.ERROR if error is not None else SpanStatus.OK,
                    status_message=tracing.message(error) if error is not None else "",
                    attributes={
                        "graphene.kind": record.kind,
                        "graphene.record.name": record.name,
                        "graphene.attempt": record.attempts + 1,
                    },
                )
            )
            if error is not None:
                metrics.inc(metrics.DELETE_FAILURES, kind=record.kind)
            elif record.deletion_requested_at is not None:
                seconds = max((event.ended_at - record.deletion_requested_at).total_seconds(), 0.0)
                latencies[record.kind].append(seconds)
    tracing.spans_write(spans)
    for kind, values in latencies.items():
        metrics.observe_many(metrics.DELETION_SECONDS, values, kind=kind)


def record_drifted(event: domain.RecordDrifted) -> None:
    metrics.inc(metrics.DRIFT_DETECTED, kind=event.record.kind)


def command_finished(event: domain.CommandFinished) -> None:
    """The command's span (in its run's trace when it logs to a run) and its count."""
    if event.log_record_ids:
        trace_id, parent, run_id = tracing.root_trace(event.log_record_ids[0])
    else:
        trace_id, parent, run_id = tracing.trace_id_of(event.command_id), "", None
    failed = event.status not in ("succeeded", "cancelled")
    attributes: dict[str, Any] = {
        "graphene.command.id": event.command_id,
        "graphene.command.kind": event.kind,
        "graphene.command.status": event.status,
        "graphene.guarantee": event.guarantee,
        "graphene.deliveries": event.deliveries,
    }
    if event.program:
        attributes["graphene.command.program"] = event.program
    if event.exit_code is not None:
        attributes["graphene.command.exit_code"] = event.exit_code
    span = Span(
        trace_id=trace_id,
        span_id=new_span_id(),
        parent_span_id=parent,
        name=(f"agent.{event.kind}" + (f" {event.program}" if event.program else ""))[:200],
        record_id=event.agent_id,
        run_id=run_id,
        started_at=event.created_at,
        ended_at=event.finished_at,
        status=SpanStatus.ERROR if failed else SpanStatus.OK,
        status_message=tracing.message(event.error or f"exit status {event.exit_code}") if failed else "",
        attributes=attributes,
    )
    tracing.spans_write([span])
    metrics.inc(metrics.AGENT_COMMANDS, kind=event.kind, status=event.status)


def subscriber_failed(event: str, subscriber: str) -> None:
    metrics.inc(metrics.SUBSCRIBER_FAILURES, event=event, subscriber=subscriber)


def subscribe() -> None:
    """Called once from ``ObservabilityConfig.ready()``."""
    domain.subscribe(domain.RecordConverged, record_converged)
    domain.subscribe(domain.RecordConvergeFailed, record_converge_failed)
    domain.subscribe(domain.RecordsDeleted, records_deleted)
    domain.subscribe(domain.RecordDrifted, record_drifted)
    domain.subscribe(domain.CommandFinished, command_finished)
    domain.on_subscriber_failure(subscriber_failed)
