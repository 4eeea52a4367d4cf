"""Reads of pipelines and runs (all authenticated users see all, for now: one choke point)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Count, F, OuterRef, Q, QuerySet, Subquery, Window
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import RowNumber

from apps.agents.models import AgentCommand
from apps.core import access
from apps.core.errors import ValidationFailed
from apps.core.selectors import get_by_uuid
from apps.observability.models import SpanStatus
from apps.observability.selectors import span_node, trace_tree
from apps.observability.tracing import run_span_id, trace_id_of
from apps.pipelines.choices import ATTACH_ARTIFACT_CALL, TERMINAL, RunStatus
from apps.pipelines.models import JournalEntry, Pipeline, Run, RunEvent, Trigger
from apps.records.choices import Phase
from apps.records.models import Record
from apps.records.selectors import record_get, record_visible, subtree_size

User = AbstractBaseUser | AnonymousUser


def run_visible(*, user: User) -> QuerySet[Run]:
    if not user.is_authenticated:
        return Run.objects.none()
    return access.scope(Run.objects.select_related("pipeline"), user, "get", "runs")


def run_get(*, user: User, run_id: Any) -> Run:
    return get_by_uuid(run_visible(user=user), run_id, noun="run")


def run_list(
    *,
    user: User,
    pipeline: str | None = None,
    statuses: list[str] | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    finished_after: datetime | None = None,
    search: str | None = None,
    parent: str | None = None,
    namespace: str | None = None,
) -> QuerySet[Run]:
    """Runs the user may see. ``search``: a run id, or ``pipeline#number``; ``parent``: the
    child runs of that run (a run id)."""
    qs = run_visible(user=user)
    if namespace:
        qs = qs.filter(namespace=namespace)
    if parent:
        try:
            qs = qs.filter(parent_run_id=uuid.UUID(str(parent)))
        except ValueError:
            raise ValidationFailed(
                f"parent={parent!r} is not a run id (a UUID)", fields={"parent": ["not a UUID"]}
            ) from None
    if pipeline:
        qs = qs.filter(pipeline__name=pipeline)
    if created_after:
        qs = qs.filter(created_at__gte=created_after)
    if created_before:
        qs = qs.filter(created_at__lt=created_before)
    if finished_after:
        qs = qs.filter(finished_at__gte=finished_after)
    if search:
        qs = _run_search(qs, search.strip())
    if statuses:
        unknown = sorted(set(statuses) - set(RunStatus.values))
        if unknown:
            raise ValidationFailed(
                f"unknown status {unknown}; statuses are {RunStatus.values}", fields={"status": unknown}
            )
        qs = qs.filter(status__in=statuses)
    return qs


def _run_search(qs: QuerySet[Run], text: str) -> QuerySet[Run]:
    name, hash_, number = text.rpartition("#")[0], "#" in text, text.rpartition("#")[2]
    if hash_ and number.isdigit():
        return qs.filter(pipeline__name=name, number=int(number)) if name else qs.filter(number=int(number))
    try:
        return qs.filter(pk=uuid.UUID(text))
    except ValueError:
        return qs.filter(pipeline__name__icontains=text)


def pipeline_run_ids(*, pipeline: str) -> QuerySet[Run, Any]:
    """The ids of the pipeline's runs (``created_by_run`` of the records they declared)."""
    return Run.objects.filter(pipeline__name=pipeline).values("pk")


def with_pipeline_name(qs: QuerySet[Any]) -> QuerySet[Any]:
    """Records annotated with ``pipeline_name``: the pipeline of the run that declared them."""
    return qs.annotate(
        pipeline_name=Subquery(Run.objects.filter(pk=OuterRef("created_by_run_id")).values("pipeline__name")[:1])
    )


def run_of_root(root_id: Any) -> Subquery:
    """The id of the run whose tree ``root_id`` (an expression) roots, as a subquery."""
    return Subquery(Run.objects.filter(record_id=root_id).values("pk")[:1])


def runs_attaching_artifact(*, user: User, artifact_id: Any) -> QuerySet[Run]:
    """The runs that attached an artifact (``ctx.attach_artifact``), newest first."""
    attached = (
        JournalEntry.objects.filter(call__startswith=ATTACH_ARTIFACT_CALL)
        .annotate(artifact=KeyTextTransform("id", "result"))
        .filter(artifact=str(artifact_id))
        .values("run_id")
    )
    return run_visible(user=user).filter(pk__in=attached).select_related("pipeline").order_by("-created_at")


def run_journal(*, run: Run, limit: int) -> list[JournalEntry]:
    return list(JournalEntry.objects.filter(run=run).order_by("seq")[:limit])


def run_events(*, run: Run) -> QuerySet[RunEvent]:
    """The run's status history, oldest first."""
    return RunEvent.objects.filter(run=run).select_related("actor").order_by("id")


def run_status_counts(*, user: User) -> dict[str, int]:
    """How many runs are in each status (one GROUP BY over the status index)."""
    rows = run_visible(user=user).order_by().values_list("status").annotate(n=Count("pk"))
    return {status: n for status, n in rows}


def run_waits(*, runs: list[Run]) -> dict[str, list[str]]:
    """What each suspended run of ``runs`` waits for, in words (``test.sleep/db (creating)``,
    ``run build#4``, ``exec on agent/box``, ``a timer until 12:30:05 UTC``): three queries
    whatever the number of runs."""
    targets = {str(t) for run in runs for t in (run.waiting_on or [])}
    records = {
        str(pk): f"{kind}/{name} ({phase})"
        for pk, kind, name, phase in Record.objects.filter(pk__in=targets).values_list("pk", "kind", "name", "phase")
    }
    children = {
        str(pk): f"run {name}#{number}"
        for pk, name, number in Run.objects.filter(pk__in=targets - records.keys()).values_list(
            "pk", "pipeline__name", "number"
        )
    }
    commands = {
        str(pk): f"{kind} on agent/{agent}"
        for pk, kind, agent in AgentCommand.objects.filter(
            pk__in=targets - records.keys() - children.keys()
        ).values_list("pk", "kind", "agent__name")
    }
    known = {**records, **children, **commands}
    waits: dict[str, list[str]] = {}
    for run in runs:
        what = [known.get(str(t), str(t)) for t in (run.waiting_on or [])]
        if run.wake_at is not None:
            what.append(f"a timer until {run.wake_at:%H:%M:%S} UTC")
        waits[str(run.pk)] = what
    return waits


def run_failures_since(*, user: User, since: datetime) -> int:
    """Runs that failed or timed out since ``since``."""
    failed = [RunStatus.FAILED, RunStatus.TIMED_OUT]
    return run_visible(user=user).filter(status__in=failed, finished_at__gte=since).count()


def pipeline_run_stats(*, user: User, since: datetime) -> dict[int, tuple[int, int]]:
    """Per pipeline id: (runs ended since ``since``, of which succeeded). One GROUP BY."""
    ended = run_visible(user=user).filter(finished_at__gte=since, status__in=list(TERMINAL))
    rows = (
        ended.order_by()
        .values_list("pipeline_id")
        .annotate(n=Count("pk"), ok=Count("pk", filter=Q(status=RunStatus.SUCCEEDED)))
    )
    return {pipeline_id: (n, ok) for pipeline_id, n, ok in rows}


def pipeline_recent_runs(*, user: User, per_pipeline: int) -> dict[int, list[Run]]:
    """Per pipeline id: its newest top-level runs, newest first, at most ``per_pipeline``
    (one query: a window over the runs, whatever the number of pipelines)."""
    ranked = (
        run_visible(user=user)
        .filter(parent_run__isnull=True)
        .annotate(rank=Window(RowNumber(), partition_by=[F("pipeline_id")], order_by=[F("number").desc()]))
        .filter(rank__lte=per_pipeline)
        .order_by("pipeline_id", "-number")
    )
    recent: dict[int, list[Run]] = {}
    for run in ranked:
        recent.setdefault(run.pipeline_id, []).append(run)
    return recent


def pipeline_get(*, name: str) -> Pipeline | None:
    return Pipeline.objects.filter(name=name).first()


def pipeline_list(*, user: User) -> QuerySet[Pipeline]:
    """Loaded pipelines in the namespaces where ``user`` may read pipelines."""
    if not user.is_authenticated:
        return Pipeline.objects.none()
    return access.scope(Pipeline.objects.filter(is_loaded=True), user, "get", "pipelines").order_by("name")


# --- triggers ----------------------------------------------------------------------------------


def trigger_list(
    *,
    user: User,
    namespace: str | None = None,
    pipeline: str | None = None,
    name: str | None = None,
    type: str | None = None,
) -> QuerySet[Trigger]:
    """Triggers of the pipelines ``user`` may read, in name order."""
    if not user.is_authenticated:
        return Trigger.objects.none()
    qs = access.scope(Trigger.objects.all(), user, "get", "pipelines")
    if type is not None and type not in ("upstream", "cron", "webhook"):
        raise ValidationFailed(
            f"type {type!r}: upstream, cron or webhook", fields={"type": ["upstream, cron or webhook"]}
        )
    filters = {"namespace": namespace, "pipeline__name": pipeline, "name": name, "type": type}
    qs = qs.filter(**{k: v for k, v in filters.items() if v is not None})
    return qs.select_related("pipeline", "paused_by").order_by("name", "pipeline__name")


def trigger_get(*, user: User, trigger_id: Any) -> Trigger:
    return get_by_uuid(trigger_list(user=user), trigger_id, noun="trigger")


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
    return (
        record_visible(user=user, resource="stands")
        .filter(kind="graphene.stand", parent__isnull=True)
        .exclude(phase=Phase.DELETED)
    )


def stand_list(*, user: User, namespace: str | None = None) -> list[StandSummary]:
    """The live stands of loaded pipelines, by name (then namespace), with how much each
    holds; only ``namespace``'s when given."""
    found = _stands(user=user)
    if namespace:
        found = found.filter(namespace=namespace)
    stands = list(found.order_by("name", "namespace"))
    known = {p.name for p in pipeline_list(user=user)}
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


def stand_find(*, user: User, pipeline: str, namespace: str | None = None) -> Record | None:
    """The pipeline's stand (the one ``services.stand_get`` gives), or None if it has none yet.
    ``namespace``: the pipeline's, where its runs hand things over (a stand root of the same
    name made by hand in another namespace is not its stand)."""
    found = _stands(user=user).filter(name=pipeline)
    if namespace is not None:
        found = found.filter(namespace=namespace)
    return found.order_by("namespace").first()


def stand_holdings_expiring(*, user: User, before: datetime) -> int:
    """Records held directly by a stand whose TTL ends before ``before`` (the TTL partial index)."""
    return (
        record_visible(user=user)
        .filter(expires_at__lte=before, deletion_requested_at__isnull=True, parent__kind="graphene.stand")
        .exclude(phase=Phase.DELETED)
        .count()
    )


def stand_holding(*, user: User, pipeline: str, record_id: Any, namespace: str | None = None) -> Record:
    """A record the pipeline's stand holds directly (what extend and release act on)."""
    stand = stand_find(user=user, pipeline=pipeline, namespace=namespace)
    record = record_get(user=user, record_id=record_id)
    if stand is None or record.parent_id != stand.pk or record.phase == Phase.DELETED:
        raise ValidationFailed(
            f"record {record.pk} is not held by the stand of {pipeline!r}",
            fields={"record": ["not a holding of this stand"]},
        )
    return record


def stand_holdings_all(*, user: User, expiring_before: datetime | None = None) -> QuerySet[Record]:
    """What every stand holds directly, by stand then expiry; with its stand, the root record of
    the run that declared it (``created_by_run``), that run's id (``from_run``) and the size of
    its subtree (``subtree_records``), in one query."""
    qs = (
        record_visible(user=user)
        .filter(parent__kind="graphene.stand", parent__parent__isnull=True)
        .exclude(phase=Phase.DELETED)
        .select_related("parent", "created_by_run")
        .annotate(from_run=run_of_root(OuterRef("created_by_run_id")), subtree_records=subtree_size())
    )
    if expiring_before is not None:
        qs = qs.filter(expires_at__lte=expiring_before, deletion_requested_at__isnull=True)
    return qs.order_by("parent__name", "expires_at", "created_at")


def stand_holdings(*, user: User, stand: Record) -> list[Record]:
    """What the stand holds directly (each the top of a subtree a run handed over), oldest first,
    each with ``subtree_records``."""
    return list(
        record_visible(user=user)
        .filter(parent=stand)
        .exclude(phase=Phase.DELETED)
        .annotate(subtree_records=subtree_size())
        .order_by("created_at")
    )


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
