"""Pipeline definitions: importing the code that defines them, their rows, their inputs."""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from graphene_sdk import Pipeline as Definition
from graphene_sdk import registered

from apps.core import access, validation
from apps.core.db import is_postgresql, models_from_row, prepared_cursor, select_columns
from apps.core.errors import NotFound
from apps.core.models import Namespace
from apps.pipelines.delivery import loader, local
from apps.pipelines.models import Pipeline, PipelineEvent, Revision, Run
from apps.pipelines.services import triggers

_load_lock = threading.Lock()
_loaded = False


# The module namespace of GRAPHENE_PIPELINE_DIRS' files when something imports them as plain
# modules (the examples' own tests do): they are delivered as revisions (delivery/local.py),
# never installed code.
DIRS_PACKAGE = "graphene_pipelines."
# How often a start looks at GRAPHENE_PIPELINE_DIRS' files for changes (a listing always does).
DIRS_LOOK_SECONDS = 1.0


def pipelines_load() -> dict[str, Definition[Any, Any]]:
    """The pipelines installed on the workers: import the modules named in
    ``GRAPHENE_PIPELINE_MODULES`` (once per process) and return what is registered."""
    global _loaded
    if not _loaded:
        with _load_lock:
            if not _loaded:
                for module in settings.GRAPHENE_PIPELINE_MODULES:
                    importlib.import_module(module)
                _loaded = True
    return {n: d for n, d in registered().items() if not d.fn.__module__.startswith(DIRS_PACKAGE)}


def _delivered(name: str) -> Pipeline | None:
    """The row of pipeline ``name`` if it is delivered as revisions (it has an active one)."""
    row = _pipeline_row(name)
    return row if row is not None and row.revision_id is not None else None


def _pipeline_row(name: str, *, lock: bool = False) -> Pipeline | None:
    """The row of pipeline ``name`` with its active revision's; ``lock``: the pipeline's row is
    locked (``FOR UPDATE``) to the end of the caller's transaction. On PostgreSQL one raw
    prepared statement (every start reads it; the queryset compiled slower than it ran)."""
    if not is_postgresql():
        query = Pipeline.objects.select_related("revision").filter(name=name)
        return (query.select_for_update(of=("self",)) if lock else query).first()
    found = pipeline_row_with(name, lock=lock)
    return found[0] if found is not None else None


def pipeline_row_with(
    name: str, extra: str = "", params: Sequence[Any] = (), *, lock: bool = False
) -> tuple[Pipeline, tuple[Any, ...]] | None:
    """PostgreSQL: ``_pipeline_row``'s statement, with the values of the SQL expressions
    ``extra`` (a select list with placeholders for ``params``; the pipeline's table is named as
    itself) read in it: the row and those values, or None when there is no such pipeline."""
    with prepared_cursor() as cursor:
        cursor.execute(_pipeline_row_sql(lock, extra), [*params, name])
        found = cursor.fetchone()
    if found is None:
        return None
    width = len(Pipeline._meta.concrete_fields) + len(Revision._meta.concrete_fields)
    row, revision = models_from_row((Pipeline, Revision), found[:width])
    row.revision = revision
    return row, tuple(found[width:])


@functools.cache
def _pipeline_row_sql(lock: bool, extra: str = "") -> str:
    # The table's own name as the alias: the statement reads as the ORM's did in pg_stat_activity.
    table = connection.ops.quote_name(Pipeline._meta.db_table)
    return (
        f"SELECT {select_columns(Pipeline, table)}, {select_columns(Revision, 'r')}{', ' + extra if extra else ''} "  # noqa: S608 - names from the models
        f"FROM {table} LEFT JOIN pipelines_revision r ON r.id = {table}.revision_id WHERE {table}.name = %s"
        + (f" FOR UPDATE OF {table}" if lock else "")
    )


def definition_get(
    name: str, *, user: Any = None, revision: Revision | None = None, row: Pipeline | None = None
) -> Definition[Any, Any]:
    """The pipeline ``name``: the code installed on the workers, else its active revision's
    (or ``revision``'s: a draft start). With ``user``: only if they may see pipelines in its
    namespace (else the same 404 as an unknown name, which lists only what they may see).
    ``row``: the pipeline's row as read already, with its active revision (not read again)."""
    return definition_lookup(name, user=user, revision=revision, row=row)[0]


def definition_lookup(
    name: str, *, user: Any = None, revision: Revision | None = None, row: Pipeline | None = None
) -> tuple[Definition[Any, Any], Pipeline | None]:
    """``definition_get``, with the pipeline's row when one was read or given (its active
    revision loaded with it): a start takes it instead of reading it again."""
    loaded = pipelines_load()
    found = loaded.get(name)
    if found is None:
        target = revision
        if target is None:
            if row is None or row.revision_id is None:
                local.dirs_deliver(max_age=DIRS_LOOK_SECONDS)  # GRAPHENE_PIPELINE_DIRS' files may have changed
                row = _delivered(name)
            if row is None:  # perhaps a pipeline of theirs whose revision this process has not made yet
                local.dirs_deliver()
                row = _delivered(name)
            if row is not None:
                target = row.revision
        if target is not None:
            found = loader.definition(target, name)
    if found is not None and (user is None or access.may(user, "get", "pipelines", found.namespace)):
        return found, row
    visible = [n for n, d in loaded.items() if user is None or access.may(user, "get", "pipelines", d.namespace)]
    delivered = Pipeline.objects.filter(revision__isnull=False)
    if user is not None:
        delivered = access.scope(delivered, user, "get", "pipelines")
    known = ", ".join(sorted({*visible, *delivered.values_list("name", flat=True)})) or "none"
    raise NotFound(f"no pipeline {name!r} is loaded; loaded pipelines: {known}")


def definition_for_run(run: Run) -> Definition[Any, Any]:
    """The code ``run`` executes and replays: its own revision's, always (the pipeline's active
    revision may have moved on since it started), or the code installed on the workers."""
    if run.revision_id is not None:
        return loader.definition(run.revision, run.pipeline.name)  # type: ignore[arg-type]
    return definition_get(run.pipeline.name)


def _pipeline_fields(definition: Definition[Any, Any]) -> dict[str, Any]:
    return {
        "source": definition.source,
        "description": definition.description,
        "input_schema": definition.input_schema(),
        "output_schema": definition.output_schema(),
        "concurrency": definition.concurrency,
        "max_pending": definition.max_pending,
        "timeout_seconds": int(definition.timeout.total_seconds()) if definition.timeout else None,
        "is_loaded": True,
        "namespace": definition.namespace,
        "trigger_specs": [t.spec() for t in definition.triggers],
    }


def _triggers_sync(row: Pipeline) -> None:
    """Installed code declared other triggers than the row's: reconcile them (refused, with the
    reason, when they cannot work or would form a cycle)."""
    specs = triggers.specs_check(row.name, row.trigger_specs, row.input_schema)
    triggers.cycle_check({row.name: specs})
    PipelineEvent.objects.bulk_create(triggers.triggers_reconcile(row, specs))


def pipeline_sync(definition: Definition[Any, Any], *, row: Pipeline | None = None, lock: bool = False) -> Pipeline:
    """The Pipeline row for a loaded definition, updated if the code changed (``row``: the
    row as read already, to spare the read), with its active revision. A pipeline delivered as
    revisions keeps the row its activation wrote.

    ``lock``: the row is locked (``FOR UPDATE``) to the end of the caller's transaction, read
    and locked in one statement (a start whose concurrency policy takes turns)."""
    if row is None:
        row = _pipeline_row(definition.name, lock=lock)
    if row is not None and row.revision_id is not None:
        return row
    fields = _pipeline_fields(definition)
    if row is None:
        # A pipeline's code names its namespace: loading it brings the namespace into being
        # (deploying pipeline code is an operator's act; who may see it is still bindings' to say).
        Namespace.objects.get_or_create(name=definition.namespace)
        with transaction.atomic():  # triggers that cannot be made leave no row behind
            row, created = Pipeline.objects.get_or_create(name=definition.name, defaults=fields)
            if created and row.trigger_specs:
                _triggers_sync(row)
        if lock:  # the row just made, now locked (it is there: this transaction made or read it)
            row = _pipeline_row(definition.name, lock=True) or row
        return row
    changed = {k: v for k, v in fields.items() if getattr(row, k) != v}
    if "namespace" in changed:
        Namespace.objects.get_or_create(name=definition.namespace)
    if changed:
        with transaction.atomic():  # triggers that cannot be made leave the row as it was
            Pipeline.objects.filter(pk=row.pk).update(**changed, updated_at=timezone.now())
            for key, value in changed.items():
                setattr(row, key, value)
            if "trigger_specs" in changed:
                _triggers_sync(row)
    return row


def pipelines_sync_all() -> list[Pipeline]:
    """Every installed definition's row, written only where the code changed: one read for all,
    so a listing costs the same queries however many pipelines there are. The directories of
    ``GRAPHENE_PIPELINE_DIRS`` are delivered first if their files changed."""
    local.dirs_deliver()
    definitions = sorted(pipelines_load().items())
    existing = {p.name: p for p in Pipeline.objects.filter(name__in=[name for name, _ in definitions])}
    rows = [pipeline_sync(d, row=existing.get(name)) for name, d in definitions]
    stale = Pipeline.objects.exclude(pk__in=[r.pk for r in rows]).filter(is_loaded=True, revision__isnull=True)
    for row in stale.exclude(trigger_specs=[]):  # code that is gone starts nothing any more
        with transaction.atomic():
            PipelineEvent.objects.bulk_create(triggers.triggers_reconcile(row, []))
            Pipeline.objects.filter(pk=row.pk).update(trigger_specs=[])
    stale.update(is_loaded=False)
    return rows


def inputs_validate(definition: Definition[Any, Any], inputs: Any) -> dict[str, Any]:
    """Validate against the pipeline's input model by the SDK's rules (``graphene_sdk.validation``:
    strict types, storable values, no undeclared inputs), as graphenectl checks them before it
    sends; errors by field path (``inputs.label``), as the API returns them."""
    model = validation.check_inputs(definition.inputs, inputs, name=definition.name)
    dumped: dict[str, Any] = model.model_dump(mode="json")
    return dumped
