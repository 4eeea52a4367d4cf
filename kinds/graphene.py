"""Graphene's own root kinds. They own trees but have no external object of their own:
creating one is bookkeeping, and deleting one is done once its subtree is gone."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from kinds import Kind

if TYPE_CHECKING:
    from apps.records.models import Record


class _RootKind(Kind):
    spec_schema: ClassVar[dict[str, Any]] = {"type": "object"}
    drift_interval = None  # nothing outside to drift

    def create(self, record: Record) -> dict[str, Any]:
        return {}

    def delete(self, record: Record) -> None:
        return None


class RunKind(_RootKind):
    name = "graphene.run"
    description = "A pipeline run: the root of the tree of everything it declared."


class StandKind(_RootKind):
    name = "graphene.stand"
    description = "A pipeline's persistent stand: holds what runs hand over, each part with its own TTL."


class SweeperKind(_RootKind):
    name = "graphene.sweeper"
    description = "The orphan sweeper; its events list the orphaned external objects it found and deleted."
