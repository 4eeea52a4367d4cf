"""Reads of pipelines and runs (all authenticated users see all, for now: one choke point)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Count, OuterRef, QuerySet, Subquery

from apps.core.errors import ValidationFailed
from apps.core.selectors import get_by_uuid
from apps.observability.models import SpanStatus
from apps.observability.selectors import span_node, trace_tree
from apps.observability.tracing import run_span_id, trace_id_of
from apps.pipelines.choices import RunStatus
from apps.pipelines.models import JournalEntry, Pipeline, Run, RunEvent
from apps.records.choices import Phase
from apps.records.models import Record
from apps.records.selectors import record_visible

User = AbstractBaseUser | AnonymousUser


def run_visible(*, user: User) -> QuerySet[Run]:
    if not user.is_authenticated:
        return Run.objects.none()
    return Run.objects.select_related("pipeline")


def run_get(*, user: User, run_id: Any) -> Run:
    return get_by_uuid(run_visible(user=user), run_id, noun="run")


def run_list(*, user: User, pipeline: str | None = None, statuses: list[str] | None = None) -> QuerySet[Run]:
    qs = run_visible(user=user)
    if pipeline:
        qs = qs.filter(pipeline__name=pipeline)
    if statuses:
        unknown = sorted(set(statuses) - set(RunStatus.values))
        if unknown:
            raise ValidationFailed(
                f"unknown status {unknown}; statuses are {RunStatus.values}", fields={"status": unknown}
            )
        qs = qs.filter(status__in=statuses)
    return qs


def pipeline_run_ids(*, pipeline: str) -> QuerySet[Run, Any]:
    """The ids of the pipeline's runs (``created_by_run`` of the records they declared)."""
    return Run.objects.filter(pipeline__name=pipeline).values("pk")


def with_pipeline_name(qs: QuerySet[Any]) -> QuerySet[Any]:
    """Records annotated with ``pipeline_name``: the pipeline of the run that declared them."""
    return qs.annotate(
        pipeline_name=Subquery(Run.objects.filter(pk=OuterRef("created_by_run_id")).values("pipeline__name")[:1])
    )


def run_journal(*, run: Run, limit: int) -> list[JournalEntry]:
    return list(JournalEntry.objects.filter(run=run).order_by("seq")[:limit])


def run_events(*, run: Run) -> QuerySet[RunEvent]:
    """The run's status history, oldest first."""
    return RunEvent.objects.filter(run=run).select_related("actor").order_by("id")


def pipeline_list() -> QuerySet[Pipeline]:
    return Pipeline.objects.filter(is_loaded=True).order_by("name")


# --- stands ------------------------------------------------------------------------------------
# A pipeline's stand is a root record (``graphene.stand``, named after the pipeline) made by
# ``services.stand_get`` when something is first handed to it. Reads never make one: a
# pipeline with no stand yet has none to show.


@dataclass(frozen=True)
class StandSummary:
    stand: Record
    holdings: int  # records the stand holds directly
    records: int  # records in its tree, itself not counted


def _stands(*, user: User) -> QuerySet[Record]:
    return record_visible(user=user).filter(kind="graphene.stand", parent__isnull=True).exclude(phase=Phase.DELETED)


def stand_list(*, user: User) -> list[StandSummary]:
    """The live stands of loaded pipelines, by name, with how much each holds."""
    stands = list(_stands(user=user).order_by("name"))
    known = {p.name for p in pipeline_list()}
    live = record_visible(user=user).filter(tree_id__in=[s.tree_id for s in stands]).exclude(phase=Phase.DELETED)
    # order_by(): the tree manager orders by (tree_id, lft), which would group by record, not by tree.
    live = live.order_by()
    sizes = dict(live.values_list("tree_id").annotate(n=Count("pk")))
    holdings = dict(live.filter(level=1).values_list("tree_id").annotate(n=Count("pk")))
    return [
        StandSummary(stand=s, holdings=holdings.get(s.tree_id, 0), records=sizes.get(s.tree_id, 1) - 1)
        for s in stands
        if s.name in known
    ]


def stand_find(*, user: User, pipeline: str) -> Record | None:
    """The pipeline's stand (the one ``services.stand_get`` gives), or None if it has none yet."""
    return _stands(user=user).filter(namespace="default", name=pipeline).first()


def stand_holdings(*, user: User, stand: Record) -> list[Record]:
    """What the stand holds directly (each the top of a subtree a run handed over), oldest first."""
    return list(record_visible(user=user).filter(parent=stand).exclude(phase=Phase.DELETED).order_by("created_at"))


def _run_status(run: Run) -> tuple[str, str]:
    error_line = (run.error or "").strip().splitlines()[-1:] or [""]
    if run.status == RunStatus.SUCCEEDED:
        return SpanStatus.OK, ""
    if run.status in (RunStatus.FAILED, RunStatus.TIMED_OUT):
        return SpanStatus.ERROR, error_line[0][:500] or run.status
    if run.status == RunStatus.CANCELLED:
        return SpanStatus.UNSET, error_line[0][:500]
    return SpanStatus.UNSET, ""


def _run_node(run: Run, *, parent_span_id: str | None) -> dict[str, Any]:
    """A run as a span, built from its row (so it is right however the run ended)."""
    status, status_message = _run_status(run)
    return span_node(
        trace_id=trace_id_of(run.pk),
        span_id=run_span_id(run.pk),
        parent_span_id=parent_span_id,
        name=f"run {run.pipeline.name}#{run.number}",
        record=str(run.record_id) if run.record_id else None,
        run=str(run.pk),
        started_at=run.created_at,
        ended_at=run.finished_at,
        status=status,
        status_message=status_message,
        attributes={
            "graphene.pipeline": run.pipeline.name,
            "graphene.run.number": run.number,
            "graphene.run.status": run.status,
            "graphene.run.attempts": run.attempt,
            "graphene.run.first_started_at": run.started_at.isoformat() if run.started_at else None,
        },
    )


def run_trace(*, run: Run) -> dict[str, Any]:
    """The run's trace as a tree: the run (root), its execution attempts, steps, convergences,
    deletions and agent commands, children in start order; child runs appear as spans that
    name their own trace."""
    root = _run_node(run, parent_span_id=None)
    children = Run.objects.filter(parent_run=run).select_related("pipeline").order_by("group", "group_index")
    extra = [_run_node(child, parent_span_id=root["span_id"]) for child in children]
    return {"run": str(run.pk), **trace_tree(trace_id=trace_id_of(run.pk), root=root, extra=extra)}
