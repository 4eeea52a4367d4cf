"""Reads of artifacts: records of kind ``artifact``, seen through ``record_visible`` (the one
authorization check of records), filtered by name, pipeline, run and labels."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import Q, QuerySet

from apps.artifacts.services import KIND, ArtifactNotFound
from apps.core.errors import ValidationFailed
from apps.records.choices import Phase
from apps.records.models import Record
from apps.records.selectors import User, filter_labels, record_visible

# Live phases in which an artifact can be attached: its blob was stored before its record.
ATTACHABLE = (Phase.PENDING, Phase.CREATING, Phase.READY, Phase.DRIFTED, Phase.UPDATING)


def _stand_tree(pipeline: str) -> Any:
    return Record.objects.filter(kind="graphene.stand", name=pipeline, parent__isnull=True).values("tree_id")


def artifact_list(
    *,
    user: User,
    name: str | None = None,
    pipeline: str | None = None,
    published_by: QuerySet[Any] | None = None,
    run: str | None = None,
    labels: dict[str, str] | None = None,
    include_deleted: bool = False,
) -> QuerySet[Record]:
    """Artifacts the user may see. ``pipeline``: held by its stand, or published by one of
    ``published_by`` (its runs' ids, which the pipelines app reads); ``run``: published by that
    run (a run id)."""
    qs = artifacts_visible(user=user)
    if not include_deleted:
        qs = qs.exclude(phase=Phase.DELETED)
    if name:
        qs = qs.filter(spec__name=name)
    if pipeline:
        held = Q(tree_id__in=_stand_tree(pipeline))
        qs = qs.filter(held | Q(created_by_run_id__in=published_by) if published_by is not None else held)
    if run:
        try:
            run_id = uuid.UUID(run)
        except ValueError:
            raise ValidationFailed(f"run={run!r} is not a run id (a UUID)", fields={"run": ["not a UUID"]}) from None
        qs = qs.filter(created_by_run_id=run_id)
    if labels:
        qs = filter_labels(qs, labels)
    return qs


def artifacts_visible(*, user: User) -> QuerySet[Record]:
    return record_visible(user=user, resource="artifacts").filter(kind=KIND)


def artifact_get(*, user: User, artifact_id: Any, among: QuerySet[Record] | None = None) -> Record:
    """One artifact the user may see (``among``: ``artifacts_visible`` narrowed or annotated)."""
    try:
        pk = uuid.UUID(str(artifact_id))
    except ValueError:
        raise ArtifactNotFound(f"no artifact {artifact_id!r}: artifact ids are record ids (UUIDs)") from None
    record = (among if among is not None else artifacts_visible(user=user)).filter(pk=pk).first()
    if record is None:
        raise ArtifactNotFound(f"no artifact {artifact_id}")
    return record


def artifact_newest(*, name: str, pipeline: str) -> Record | None:
    """The newest live artifact named ``name`` held in ``pipeline``'s stand (``ctx.attach_artifact``)."""
    return (
        Record.objects.filter(kind=KIND, spec__name=name, tree_id__in=_stand_tree(pipeline), phase__in=ATTACHABLE)
        .filter(deletion_requested_at__isnull=True)
        .order_by("-created_at", "-pk")
        .first()
    )


def artifact_attachable(*, artifact_id: str) -> Record | None:
    """A live artifact by id (``ctx.attach_artifact(id)``), wherever it is held."""
    try:
        pk = uuid.UUID(artifact_id)
    except ValueError:
        return None
    return Record.objects.filter(kind=KIND, pk=pk, phase__in=ATTACHABLE, deletion_requested_at__isnull=True).first()
