"""What every part of an execution shares: the run, its lease token, its journal, and the
rules that say which records the run may act on."""

from __future__ import annotations

import uuid
from typing import Any

from graphene_sdk import Pipeline as Definition
from graphene_sdk import ResourceFailed

from apps.observability.tracing import RunTelemetry
from apps.pipelines.engine.journal import Journal
from apps.pipelines.models import Run
from apps.records.models import Record


class ExecutionState:
    """The attributes ``Execution`` sets up, for the parts it is made of."""

    run: Run
    run_id: str
    token: uuid.UUID
    definition: Definition[Any, Any]
    journal: Journal
    # Agents this run found (attach_agent, select_agents): it may run commands on them
    # without owning them. Filled as those calls run or replay, before any command on them.
    attached_agents: set[str]
    telemetry: RunTelemetry

    def owned(self, record_id: str, run: Run) -> Record:
        """A live record in this run's tree (which the run may give away)."""
        if run.record_id is None:
            raise ResourceFailed("this run has no record tree")
        record = Record.objects.filter(pk=record_id).first()
        root = Record.objects.get(pk=run.record_id)
        if record is None or record.tree_id != root.tree_id or record.pk == root.pk:
            raise ResourceFailed(f"record {record_id} is not owned by this run")
        return record

    def owner(self, parent: str | None, run: Run) -> Record:
        """The record a declaration goes under: the run's root, or ``parent`` in its tree."""
        if run.record_id is None:
            raise ResourceFailed("this run has no record to own declarations")
        if parent is None:
            return Record.objects.get(pk=run.record_id)
        owner = Record.objects.filter(pk=parent).first()
        root = Record.objects.get(pk=run.record_id)
        if owner is None or owner.tree_id != root.tree_id:
            raise ResourceFailed(f"parent {parent} is not a record owned by this run")
        return owner
