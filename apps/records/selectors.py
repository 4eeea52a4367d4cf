"""Reads of records and events. Every read goes through ``record_visible``, which narrows to
the namespaces where the access module lets the user read records."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Count, F, OuterRef, QuerySet, Subquery, Window
from django.db.models.functions import RowNumber

from apps.core import access
from apps.core.db import is_postgresql
from apps.core.errors import ValidationFailed
from apps.core.selectors import get_by_uuid
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record

User = AbstractBaseUser | AnonymousUser


def record_visible(*, user: User, resource: str = "records") -> QuerySet[Record]:
    """The records ``user`` may read (as ``resource``: agents and artifacts are records too)."""
    if not user.is_authenticated:
        return Record.objects.none()
    return access.scope(Record.objects.all(), user, "get", resource)


def record_get(*, user: User, record_id: Any) -> Record:
    return get_by_uuid(record_visible(user=user), record_id, noun="record")


def filter_labels(qs: QuerySet[Record], labels: dict[str, str]) -> QuerySet[Record]:
    """Records carrying every ``labels`` pair."""
    if is_postgresql():
        return qs.filter(labels__contains=labels)  # jsonb @>, indexable
    for key, value in labels.items():  # SQLite (embedded) has no JSON containment
        qs = qs.filter(**{f"labels__{key}": value})
    return qs


def parse_label_selector(values: list[str]) -> dict[str, str]:
    """``key=value`` selectors (each value one pair, or pairs joined by commas) as a dict; the
    API's schema declares the same form (``apps.api.schema.LABEL_SELECTOR_PATTERN``)."""
    labels: dict[str, str] = {}
    for value in values:
        for part in value.split(","):
            key, sep, val = part.partition("=")
            if not sep or not key:
                raise ValidationFailed(f"label selector {part!r} must look like key=value", fields={"label": [part]})
            labels[key] = val
    return labels


def record_list(
    *,
    user: User,
    kind: str | None = None,
    phases: list[str] | None = None,
    owner: Any = None,
    labels: dict[str, str] | None = None,
    name_prefix: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    updated_after: datetime | None = None,
    updated_before: datetime | None = None,
    include_deleted: bool = True,
    namespace: str | None = None,
) -> QuerySet[Record]:
    qs = record_visible(user=user)
    if namespace:
        qs = qs.filter(namespace=namespace)
    if kind:
        qs = qs.filter(kind=kind)
    if phases:
        unknown = sorted(set(phases) - set(Phase.values))
        if unknown:
            raise ValidationFailed(f"unknown phase {unknown}; phases are {Phase.values}", fields={"phase": unknown})
        qs = qs.filter(phase__in=phases)
    elif not include_deleted:
        qs = qs.exclude(phase=Phase.DELETED)
    if owner:
        qs = qs.filter(parent_id=owner)
    if labels:
        qs = filter_labels(qs, labels)
    if name_prefix:
        qs = qs.filter(name__startswith=name_prefix)
    if created_after:
        qs = qs.filter(created_at__gte=created_after)
    if created_before:
        qs = qs.filter(created_at__lt=created_before)
    if updated_after:
        qs = qs.filter(updated_at__gte=updated_after)
    if updated_before:
        qs = qs.filter(updated_at__lt=updated_before)
    return qs


def record_owner_chain(*, record: Record) -> list[Record]:
    """Owners from the root down to the direct owner (one query on the tree columns)."""
    return list(record.get_ancestors())


def record_children_counts(*, record: Record) -> dict[str, int]:
    """Direct children by phase."""
    # order_by(): the tree manager orders by (tree_id, lft), which would split the groups.
    rows = Record.objects.filter(parent=record).order_by().values("phase").annotate(n=Count("pk"))
    return {row["phase"]: row["n"] for row in rows}


def record_deletion_blockers(*, record: Record, limit: int = 20) -> list[Record]:
    """The protected records a requested deletion of ``record`` waits on: in its subtree (or
    it), with their deletion requested; none when its deletion was not requested."""
    if record.deletion_requested_at is None or record.phase == Phase.DELETED:
        return []
    blockers = Record.objects.filter(
        tree_id=record.tree_id,
        lft__gte=record.lft,
        rght__lte=record.rght,
        protected=True,
        deletion_requested_at__isnull=False,
    )
    return list(blockers.order_by("lft").only("id", "kind", "name", "protected_by")[:limit])


def subtree_of(record: Record) -> QuerySet[Record]:
    """The record and its descendants, bounded by the record's row *as the query runs*: a
    declaration committed meanwhile shifts ``lft``/``rght``, and bounds read earlier (the
    ``record`` instance's) would cut the subtree, or leave the record itself out."""
    me = Record.objects.filter(pk=record.pk)
    return Record.objects.filter(
        tree_id=Subquery(me.values("tree_id")),
        lft__gte=Subquery(me.values("lft")),
        rght__lte=Subquery(me.values("rght")),
    )


def owners_among(*, record_id: Any, candidates: Sequence[Any]) -> set[str]:
    """Which of the ``candidates`` (record ids) own ``record_id``, directly or further up the
    tree, as the query runs (one query)."""
    if not candidates:
        return set()
    me = Record.objects.filter(pk=record_id)
    owners = Record.objects.filter(
        pk__in=list(candidates),
        tree_id=Subquery(me.values("tree_id")),
        lft__lt=Subquery(me.values("lft")),
        rght__gt=Subquery(me.values("rght")),
    )
    return {str(pk) for pk in owners.values_list("pk", flat=True)}


def records_owning(records: Iterable[Record]) -> set[Any]:
    """The ids of those of ``records`` that own at least one record (one query). Bounds are no
    answer: a record's may hold only free numbers (``Record.tree_slack``); only a record whose
    bounds are adjacent is known to own nothing without asking."""
    ids = [r.pk for r in records if r.rght - r.lft > 1]
    if not ids:
        return set()
    return set(Record.objects.filter(parent_id__in=ids).values_list("parent_id", flat=True).distinct())


def subtree_size() -> Subquery:
    """An expression for a query of records: the rows of each one's subtree, itself included
    (deleted ones not yet purged too), counted in that query; its bounds do not give the count
    (``Record.tree_slack``)."""
    return Subquery(
        Record.objects.filter(tree_id=OuterRef("tree_id"), lft__gte=OuterRef("lft"), rght__lte=OuterRef("rght"))
        .order_by()
        .values("tree_id")
        .annotate(n=Count("pk"))
        .values("n")
    )


def record_subtree(*, record: Record, depth: int) -> list[Record]:
    """The record and its descendants down to ``depth`` levels, in tree order."""
    return list(subtree_of(record).filter(level__lte=record.level + depth).order_by("lft"))


# What lists of records never need to read: their documents (a page of rows stays small).
LIST_DEFERRED = ("spec", "outputs", "conditions", "moved_from")


def record_roots(*, user: User, namespace: str | None = None, include_deleted: bool = False) -> QuerySet[Record]:
    """The roots of the trees (runs, stands, the sweeper), newest first; tombstones only if asked."""
    qs = record_visible(user=user).filter(parent__isnull=True)
    if namespace:
        qs = qs.filter(namespace=namespace)
    if not include_deleted:
        qs = qs.exclude(phase=Phase.DELETED)
    return qs.defer(*LIST_DEFERRED).order_by("-created_at", "-pk")


def record_tree_rows(*, roots: Sequence[Record], per_tree: int, include_deleted: bool = False) -> list[Record]:
    """Below each of ``roots``: its first ``per_tree`` descendants in tree order, each annotated
    with ``below`` (how many descendants its root has in all), in one query whatever the count.
    Rows come by tree, then in tree order (``lft``)."""
    qs = Record.objects.filter(tree_id__in=[root.tree_id for root in roots], level__gt=0)
    if not include_deleted:
        qs = qs.exclude(phase=Phase.DELETED)
    return list(
        qs.defer(*LIST_DEFERRED)
        .annotate(
            position=Window(RowNumber(), partition_by=[F("tree_id")], order_by=F("lft").asc()),
            below=Window(Count("pk"), partition_by=[F("tree_id")]),
        )
        .filter(position__lte=per_tree)
        .order_by("tree_id", "lft")
    )


def record_children(*, record: Record, include_deleted: bool = False, limit: int = 200) -> list[Record]:
    """The records ``record`` owns directly, oldest first (at most ``limit``)."""
    qs = Record.objects.filter(parent=record)
    if not include_deleted:
        qs = qs.exclude(phase=Phase.DELETED)
    return list(qs.defer(*LIST_DEFERRED).order_by("created_at", "pk")[:limit])


def record_subtree_kind_counts(*, record: Record) -> dict[str, int]:
    """What deleting ``record`` deletes: its live subtree (itself included), counted per kind."""
    rows = subtree_of(record).exclude(phase=Phase.DELETED).order_by().values_list("kind").annotate(n=Count("pk"))
    return dict(sorted(rows))


def record_subtree_live(*, record: Record, limit: int) -> list[Record]:
    """The live records of ``record``'s subtree in tree order (at most ``limit``)."""
    return list(subtree_of(record).exclude(phase=Phase.DELETED).defer(*LIST_DEFERRED).order_by("lft")[:limit])


def record_subtree_protected(*, record: Record, limit: int = 20) -> list[Record]:
    """The live protected records in ``record``'s subtree (it included), in tree order: where
    a deletion of it would stop."""
    protected = subtree_of(record).filter(protected=True).exclude(phase=Phase.DELETED)
    return list(protected.only("id", "kind", "name").order_by("lft")[:limit])


def record_events(*, record: Record) -> QuerySet[Event]:
    return Event.objects.filter(record=record).select_related("actor").order_by("id")


def record_deletion_requested(*, record_id: Any) -> bool:
    """Whether the record's deletion has been requested, as the row says now (a kind's long
    wait in ``create`` gives up then: the deletion waits for it). A system read, not a user's."""
    return Record.objects.filter(pk=record_id, deletion_requested_at__isnull=False).exists()


def record_phase_counts(*, user: User, phases: Sequence[str]) -> dict[str, int]:
    """How many records are in each of ``phases`` (one GROUP BY over the (kind, phase) index)."""
    rows = record_visible(user=user).filter(phase__in=phases).order_by().values_list("phase").annotate(n=Count("pk"))
    counts = dict.fromkeys(phases, 0)
    counts.update({phase: n for phase, n in rows})
    return counts


def orphan_findings_since(*, since: datetime) -> int:
    """External objects the orphan sweeper found without a live record since ``since`` (its events)."""
    return Event.objects.filter(
        record__kind="graphene.sweeper",
        type__in=[EventType.ORPHAN_DELETED, EventType.ORPHAN_DELETE_FAILED],
        created_at__gte=since,
    ).count()
