"""What a run in the world leaves behind: its records, its log lines and its result."""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Literal

from graphene_sdk._pipeline import OutputT

if TYPE_CHECKING:
    from graphene_sdk.testing._world import World

# The subset of the real record phases that the world uses.
Phase = Literal["pending", "updating", "ready", "create_failed", "deleted"]
# The subset of the real run statuses that an in-process run can end in.
RunStatus = Literal["running", "succeeded", "failed", "timed_out"]


@dataclass(eq=False)
class Record:
    """A record in the world. A live view: it changes as the world does (owner, phase...).

    ``owner`` is ``"run:<run id>"``, ``"record:<record id>"`` or ``"stand:<pipeline>"``.
    """

    id: str
    kind: str
    name: str
    spec: dict[str, Any]
    labels: dict[str, str]
    owner: str
    declared_by: str  # the id of the run that declared it
    created_at: datetime
    settles_at: datetime  # when convergence ends (ready or create_failed)
    phase: Phase = "pending"
    outputs: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    generation: int = 1
    expires_at: datetime | None = None
    deleted_at: datetime | None = None
    deletion_reason: str = ""
    position: int = 0  # order among its owner's records: declaration, or arrival by transfer
    protected: bool = False  # a deletion stops here (``protect=True``, ``World.protect``)
    # The reason of a deletion that reached this record and waits: it is protected, a protected
    # record owns it, or it owns one (children go first). Empty when no deletion waits here.
    deletion_waiting: str = ""

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def alive(self) -> bool:
        return self.phase != "deleted"

    def __repr__(self) -> str:
        return f"Record({self.label}, id={self.id}, phase={self.phase}, owner={self.owner})"


@dataclass(frozen=True)
class LogLine:
    """A line a run wrote with ``ctx.log``, stamped with the virtual time."""

    at: datetime
    level: str
    message: str


@dataclass(eq=False)
class RunResult(Generic[OutputT]):
    """One run of a pipeline in the world: its status, output or error, logs and records."""

    run_id: str
    pipeline: str
    inputs: dict[str, Any]
    started_at: datetime
    parent_run_id: str | None = None
    status: RunStatus = "running"
    output: OutputT | None = None  # validated with the pipeline's output model
    output_json: Any = None  # what the engine would store (and a parent's ``ctx.run`` receives)
    error: BaseException | None = None
    finished_at: datetime | None = None
    logs: list[LogLine] = field(default_factory=list)
    children: list[RunResult[Any]] = field(default_factory=list)  # child runs, in start order
    _world: World | None = field(default=None, repr=False)

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @property
    def error_text(self) -> str:
        """The error as the engine reports it (type and message), or ``""``."""
        if self.error is None:
            return ""
        return "".join(traceback.format_exception_only(type(self.error), self.error)).strip()

    @property
    def records(self) -> list[Record]:
        """Every record this run declared (live or deleted), in declaration order."""
        assert self._world is not None
        return [r for r in self._world._records.values() if r.declared_by == self.run_id]

    def record(self, name: str, *, kind: str | None = None) -> Record:
        """The one record this run declared with this name (and kind); ``LookupError`` otherwise."""
        found = [r for r in self.records if r.name == name and (kind is None or r.kind == kind)]
        return exactly_one(found, f"record named {name!r}" + (f" of kind {kind}" if kind else ""), self.records)

    def unwrap(self) -> OutputT | None:
        """The output; re-raises the run's error if it did not succeed (handy for a clear traceback)."""
        if self.error is not None:
            raise self.error
        if self.status != "succeeded":
            raise AssertionError(f"run {self.run_id} of {self.pipeline} is {self.status}")
        return self.output


def exactly_one(found: list[Record], what: str, among: Sequence[Record]) -> Record:
    if len(found) == 1:
        return found[0]
    if not found:
        known = ", ".join(sorted({r.label for r in among})) or "none"
        raise LookupError(f"no {what}; records: {known}")
    raise LookupError(f"{len(found)} records match {what}: {found}; narrow it down (kind=..., or by id)")
