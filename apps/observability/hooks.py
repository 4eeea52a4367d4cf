"""What other apps call where work happens (one line each at their call sites, marked
``# observability``): spans in the caller's transaction, metrics into the process's buffer.

Explicit calls, not signals: the call sites are where the outcome is known, and reading
``apps/records/services.py`` shows every place telemetry is taken. Every hook is defensive:
telemetry must never fail or slow down the work it describes, so errors are logged and
swallowed, except database errors inside the caller's transaction, which would break it
anyway.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from apps.observability import metrics, tracing
from apps.observability.models import Span, SpanStatus
from apps.observability.tracing import RunTelemetry, new_span_id, now

if TYPE_CHECKING:
    from apps.agents.models import AgentCommand
    from apps.records.models import Record

logger = logging.getLogger(__name__)

__all__ = ["RunTelemetry", "command_finished", "converge_failed", "converged", "deleted", "now"]


def _span(record: Record, name: str, started_at: datetime, attributes: dict[str, Any], *, error: str = "") -> Span:
    trace_id, parent, run_id = tracing.record_trace(record)
    return Span(
        trace_id=trace_id,
        span_id=new_span_id(),
        parent_span_id=parent,
        name=name,
        record_id=record.pk,
        run_id=run_id,
        started_at=started_at,
        ended_at=now(),
        status=SpanStatus.ERROR if error else SpanStatus.OK,
        status_message=tracing.message(error) if error else "",
        attributes={"graphene.kind": record.kind, "graphene.record.name": record.name, **attributes},
    )


def converged(record: Record, started_at: datetime, outputs: Any) -> None:
    """``record_converge`` is moving the record to ready (inside its transaction, just before
    the transition): a first creation, or an update of a new generation."""
    created = record.phase != "updating"
    adopted = bool(outputs.get("adopted")) if isinstance(outputs, dict) else False
    attributes = {"graphene.generation": record.generation, "graphene.created": created, "graphene.adopted": adopted}
    span = _span(record, "record_converge", started_at, attributes)
    tracing.spans_write([span])
    if created:
        seconds = max((span.ended_at - record.created_at).total_seconds(), 0.0)
        metrics.observe(metrics.CONVERGENCE_SECONDS, seconds, kind=record.kind)


def converge_failed(record: Record, started_at: datetime, error: BaseException) -> None:
    """A create/update attempt raised (outside any transaction: one INSERT, on a slow path)."""
    try:
        attributes = {"graphene.generation": record.generation, "graphene.attempt": record.attempts + 1}
        tracing.spans_write([_span(record, "record_converge", started_at, attributes, error=tracing.message(error))])
        metrics.inc(metrics.CONVERGE_FAILURES, kind=record.kind)
    except Exception:
        logger.warning("could not record the failed convergence of %s", record.pk, exc_info=True)


def deleted(records: Sequence[Record], results: Mapping[Any, BaseException | None], started_at: datetime) -> None:
    """A deletion batch ran the kinds' deletes (inside the transaction that marks them deleted).

    One ``records.delete_batch`` span per trace in the batch (usually one: a batch holds part
    of one run's tree), with a ``record.delete`` child per record.
    """
    if not records:
        return
    ended = now()
    spans: list[Span] = []
    by_trace: dict[tuple[str, str, str | None], list[Record]] = defaultdict(list)
    for record in records:
        by_trace[tracing.record_trace(record)].append(record)
    latencies: dict[str, list[float]] = defaultdict(list)
    for (trace_id, parent, run_id), group in by_trace.items():
        batch_id = new_span_id()
        failures = sum(1 for r in group if results.get(r.pk) is not None)
        spans.append(
            Span(
                trace_id=trace_id,
                span_id=batch_id,
                parent_span_id=parent,
                name="records.delete_batch",
                record_id=None,
                run_id=run_id,
                started_at=started_at,
                ended_at=ended,
                status=SpanStatus.ERROR if failures else SpanStatus.OK,
                status_message=f"{failures} of {len(group)} delete(s) failed" if failures else "",
                attributes={"graphene.records": len(group), "graphene.failures": failures},
            )
        )
        for record in group:
            error = results.get(record.pk)
            spans.append(
                Span(
                    trace_id=trace_id,
                    span_id=new_span_id(),
                    parent_span_id=batch_id,
                    name="record.delete",
                    record_id=record.pk,
                    run_id=run_id,
                    started_at=started_at,
                    ended_at=ended,
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
                latencies[record.kind].append(max((ended - record.deletion_requested_at).total_seconds(), 0.0))
    tracing.spans_write(spans)
    for kind, values in latencies.items():
        metrics.observe_many(metrics.DELETION_SECONDS, values, kind=kind)


def command_finished(command: AgentCommand) -> None:
    """An agent command reached its end (inside the transaction that records it).

    Attributes name the command, never its payload: argv and env may carry secret values (I7).
    """
    if command.log_record_ids:
        trace_id, parent, run_id = tracing.root_trace(command.log_record_ids[0])
    else:
        trace_id, parent, run_id = tracing.trace_id_of(command.pk), "", None
    failed = command.status not in ("succeeded", "cancelled")
    argv = command.payload.get("argv") if isinstance(command.payload, dict) else None
    program = str(argv[0]).rsplit("/", 1)[-1] if isinstance(argv, list) and argv else ""
    attributes: dict[str, Any] = {
        "graphene.command.id": str(command.pk),
        "graphene.command.kind": command.kind,
        "graphene.command.status": command.status,
        "graphene.guarantee": command.guarantee,
        "graphene.deliveries": command.deliveries,
    }
    if program:
        attributes["graphene.command.program"] = program
    if command.exit_code is not None:
        attributes["graphene.command.exit_code"] = command.exit_code
    span = Span(
        trace_id=trace_id,
        span_id=new_span_id(),
        parent_span_id=parent,
        name=(f"agent.{command.kind}" + (f" {program}" if program else ""))[:200],
        record_id=command.agent_id,
        run_id=run_id,
        started_at=command.created_at,
        ended_at=command.finished_at or now(),
        status=SpanStatus.ERROR if failed else SpanStatus.OK,
        status_message=tracing.message(command.error or f"exit status {command.exit_code}") if failed else "",
        attributes=attributes,
    )
    tracing.spans_write([span])
    metrics.inc(metrics.AGENT_COMMANDS, kind=command.kind, status=command.status)
