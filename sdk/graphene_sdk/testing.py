"""Test pipelines in-process, against an in-memory world with a virtual clock.

    from datetime import timedelta
    from graphene_sdk.testing import World

    def test_environment_is_cleaned_up() -> None:
        world = World()
        result = world.run(integration, Inputs(branch="dev"))
        assert result.status == "succeeded"
        world.assert_no_leaks()
        db = result.record("db")
        world.assert_owner(db, "stand:integration")
        world.advance(hours=5)
        assert db.phase == "deleted"

The world mirrors the ownership rules of the real system: every record has exactly one
owner (a run, another record or a pipeline's stand); when a run ends, whatever it still owns
is deleted, children first; ``ctx.to_stand`` gives a subtree to the pipeline's stand with an
optional TTL, and a TTL running out deletes that subtree. Kinds are simulated generically
(``World.kind``, ``World.on_create``); steps run directly; ``ctx.sleep``, step retries and
slow kinds move the virtual clock instead of waiting. No server, database or network.
Agents' machines are simulated too: ``exec`` answers through ``World.on_exec``,
``put_file``/``get_file`` use an in-memory file system per agent (``world.files``), and
``agent.run`` runs the function's source in this process as the machine would
(``World.on_call`` replaces that).

What is *not* simulated: crashes and replay (so ``at_most_once`` never yields
``OutcomeUnknown``), drift, failing deletions, cancellation and the concurrency policies
between runs (``world.run`` runs one run at a time, to its end; ``run_all`` runs its
children one after another, which honours any ``concurrency`` limit).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import linecache
import mimetypes
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Generic, Literal

from pydantic import BaseModel

from graphene_sdk._artifacts import ArtifactRef
from graphene_sdk._context import Attached, Context, Guarantee, Resource
from graphene_sdk._errors import ChildRunFailed, RemoteError, ResourceFailed, StepFailed, StepTimeout
from graphene_sdk._pipeline import InputT, OutputT, Pipeline
from graphene_sdk._remote import MAX_CALL_RESULT_BYTES, RemoteCall

__all__ = ["LogLine", "Phase", "Record", "RunResult", "RunStatus", "World"]

# The subset of the real record phases that the world uses.
Phase = Literal["pending", "updating", "ready", "create_failed", "deleted"]
# The subset of the real run statuses that an in-process run can end in.
RunStatus = Literal["running", "succeeded", "failed", "timed_out"]

OutputsFn = Callable[[dict[str, Any]], Mapping[str, Any]]

# Kinds that are roots of their own trees in the real system: nothing can own them.
_ROOT_KINDS = frozenset({"graphene.run", "graphene.stand", "graphene.sweeper"})
_CONVERGING: frozenset[str] = frozenset({"pending", "updating"})
_MAX_BACKOFF_SECONDS = 30.0  # the engine's cap on the pause between step attempts


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
        return _exactly_one(found, f"record named {name!r}" + (f" of kind {kind}" if kind else ""), self.records)

    def unwrap(self) -> OutputT | None:
        """The output; re-raises the run's error if it did not succeed (handy for a clear traceback)."""
        if self.error is not None:
            raise self.error
        if self.status != "succeeded":
            raise AssertionError(f"run {self.run_id} of {self.pipeline} is {self.status}")
        return self.output


# What the inspection and assertion methods accept as a record, and as an owner.
HandleLike = Resource | Attached | Record | str
OwnerLike = Resource | Attached | Record | RunResult[Any] | Pipeline[Any, Any] | str


@dataclass
class _KindBehaviour:
    fail: str = ""
    create_seconds: float = 0.0
    outputs: OutputsFn | None = None


class _TimedOut(BaseException):
    """Unwinds a run past its deadline (not an ``Exception``: pipeline code cannot swallow it)."""


def _exactly_one(found: list[Record], what: str, among: Sequence[Record]) -> Record:
    if len(found) == 1:
        return found[0]
    if not found:
        known = ", ".join(sorted({r.label for r in among})) or "none"
        raise LookupError(f"no {what}; records: {known}")
    raise LookupError(f"{len(found)} records match {what}: {found}; narrow it down (kind=..., or by id)")


def _json(value: Any) -> Any:
    """The JSON form the engine journals and returns (pydantic models are dumped first)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return json.loads(json.dumps(value))


def _delta(value: timedelta | None, days: float, hours: float, minutes: float, seconds: float) -> timedelta:
    return (value or timedelta()) + timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


ExecFn = Callable[[str, list[str]], tuple[int, str, str]]
# ``handler(agent_name, function_name, args, kwargs) -> value`` (see ``World.on_call``).
CallFn = Callable[[str, str, list[Any], dict[str, Any]], Any]


def run_source(call: RemoteCall) -> Any:
    """What the machine does with an ``Agent.run`` call, in this process: the function's source
    alone, compiled with postponed annotations in a fresh module namespace, called with the
    JSON arguments. So a function that leans on its module fails here as it would there."""
    import __future__

    namespace: dict[str, Any] = {"__name__": "graphene_call", "__builtins__": __builtins__}
    filename = f"<agent.run {call.name}>"
    linecache.cache[filename] = (len(call.source), None, call.source.splitlines(True), filename)
    code = compile(call.source, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)  # noqa: S102 - the pipeline's own function, as the agent would run it
    return namespace[call.name](*call.args, **call.kwargs)


class World:
    """An in-memory Graphene: records, runs, stands and a virtual clock.

    ``World(start=...)`` sets the clock's first reading (a fixed date by default, so runs are
    reproducible); ``retry_base_seconds`` is the first pause between step attempts (doubled
    each time, at most 30 s, as in the engine) and only moves the virtual clock.
    """

    def __init__(self, *, start: datetime | None = None, retry_base_seconds: float = 1.0) -> None:
        if start is not None and start.tzinfo is None:
            raise ValueError("start must be timezone-aware")
        if retry_base_seconds < 0:
            raise ValueError("retry_base_seconds must not be negative")
        self._now = start or datetime(2030, 1, 1, tzinfo=UTC)
        self.retry_base_seconds = retry_base_seconds
        self._ids = itertools.count(1)
        self._positions = itertools.count(1)
        self._records: dict[str, Record] = {}
        self._runs: dict[str, RunResult[Any]] = {}
        self._kinds: dict[str, _KindBehaviour] = {}
        self._deletions: list[Record] = []
        self._exec: ExecFn = lambda agent, argv: (0, "", "")
        self.commands: list[tuple[str, list[str]]] = []
        # What ``agent.put_file`` wrote, per agent name and path (``agent.get_file`` reads it).
        self.files: dict[str, dict[str, bytes]] = {}
        # ``agent.run`` calls as (agent name, function name, args, kwargs), JSON as sent.
        self.calls: list[tuple[str, str, list[Any], dict[str, Any]]] = []
        self._call: CallFn | None = None
        # ``ctx.agent_via_ssh`` calls as (agent name, target): host, port, user, the key's
        # secret name and the pinned host key. Nothing is installed in the world.
        self.ssh_installs: list[tuple[str, dict[str, Any]]] = []
        # The blob store: artifacts' bytes by sha256 (``ctx.publish_artifact``, ``put_artifact``).
        self.blobs: dict[str, bytes] = {}
        # What agents' machines offer, per agent record id: capability name -> (version, labels)
        # (``ctx.publish_capability``, ``World.add_agent``; matched by ``need(...)``).
        self.capabilities: dict[str, dict[str, tuple[str, dict[str, str]]]] = {}

    # --- configuration -----------------------------------------------------------------------

    def on_exec(self, handler: ExecFn) -> None:
        """How agents answer ``agent.exec``: ``handler(agent_name, argv) -> (exit, stdout, stderr)``.

        Every command is also recorded in ``world.commands`` as ``(agent_name, argv)``.
        """
        self._exec = handler

    def add_agent(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        capabilities: Mapping[str, tuple[str, Mapping[str, str]]] | None = None,
    ) -> Record:
        """A machine that exists before any run (for ``ctx.attach_agent``/``ctx.select_agents``):
        a ready agent record held by the stand ``stand:machines``. ``capabilities`` maps a
        capability name to ``(version, labels)``, as ``ctx.publish_capability`` would publish it."""
        if not name:
            raise ValueError("an agent needs a name")
        record = Record(
            id=self._new_id(),
            kind="agent",
            name=name,
            spec={},
            labels=dict(labels or {}),
            owner="stand:machines",
            declared_by="",
            created_at=self._now,
            settles_at=self._now,
            phase="ready",
        )
        record.outputs = {"id": record.id, "kind": "agent", "name": name}
        record.position = next(self._positions)
        self._records[record.id] = record
        self.capabilities[record.id] = {k: (v, dict(ls)) for k, (v, ls) in (capabilities or {}).items()}
        return record

    def _unmet(self, record: Record, needs: list[dict[str, Any]]) -> list[str]:
        """The needs (JSON, as ``need(...).to_json()``) that ``record``'s capabilities do not meet."""
        offered = self.capabilities.get(record.id, {})
        unmet = []
        for item in needs:
            found = offered.get(item["name"])
            values = {**found[1], "version": found[0]} if found is not None else {}
            ok = found is not None and all(values.get(k) == v for k, v in item["where_label"].items())
            ok = ok and all(values.get(k) in allowed for k, allowed in item["where_in"].items())
            if not ok:
                unmet.append(item["name"] if found is None else f"{item['name']} (it publishes {values})")
        return unmet

    def on_call(self, handler: CallFn) -> None:
        """How agents answer ``agent.run``: ``handler(agent_name, function_name, args, kwargs) -> value``.

        An exception the handler raises is what the function raised on the machine: the run
        sees ``RemoteError`` with its type and message. Without a handler the function's source
        runs here, in this process, as the machine would run it (a fresh namespace: it must
        import what it needs in its body); it sees this machine's files, not ``world.files``.
        Every call is recorded in ``world.calls``.
        """
        self._call = handler

    def kind(
        self,
        name: str,
        *,
        fail: bool | str = False,
        create_seconds: float = 0.0,
        outputs: OutputsFn | None = None,
    ) -> None:
        """Set how records of kind ``name`` behave (replacing what was set before).

        ``fail``: creation fails (``True`` or the error message), so ``ready()`` raises
        ``ResourceFailed``. ``create_seconds``: virtual time a record takes to become ready;
        ``ready()`` moves the clock forward to it. ``outputs``: see ``on_create``.
        """
        if not name:
            raise ValueError("a kind needs a name")
        if create_seconds < 0:
            raise ValueError("create_seconds must not be negative")
        message = "injected create failure" if fail is True else (fail or "")
        self._kinds[name] = _KindBehaviour(fail=message, create_seconds=float(create_seconds), outputs=outputs)

    def on_create(self, kind: str, outputs: OutputsFn) -> None:
        """Compute the outputs of ``kind``'s records from their spec: ``outputs(spec) -> dict``.

        Outputs are ``{"id", "kind", "name"}`` plus what it returns; if it raises, the record
        fails with that error (so one function can fail some records and not others). Without
        it, outputs echo the spec plus ``id``, ``kind`` and ``name``.
        """
        if not kind:
            raise ValueError("a kind needs a name")
        self._kinds.setdefault(kind, _KindBehaviour()).outputs = outputs

    # --- the clock ---------------------------------------------------------------------------

    @property
    def now(self) -> datetime:
        """The virtual time (timezone-aware UTC)."""
        return self._now

    def advance(
        self,
        delta: timedelta | None = None,
        *,
        days: float = 0,
        hours: float = 0,
        minutes: float = 0,
        seconds: float = 0,
    ) -> list[Record]:
        """Move the clock forward; records settle and TTLs expire at their moment, in order.

        Returns the records deleted meanwhile, in deletion order (children before parents).
        """
        step = _delta(delta, days, hours, minutes, seconds)
        if step < timedelta(0):
            raise ValueError("the clock only moves forward")
        return self._advance_to(self._now + step)

    def _advance_to(self, target: datetime) -> list[Record]:
        deleted = len(self._deletions)
        while (moment := self._next_event(target)) is not None:
            self._now = max(self._now, moment)
            for record in [r for r in self._records.values() if r.phase in _CONVERGING]:
                if record.settles_at <= self._now:
                    self._converge(record)
            due = [r for r in self._records.values() if r.alive and r.expires_at and r.expires_at <= self._now]
            for record in sorted(due, key=lambda r: (r.expires_at, r.position)):
                if record.alive:  # an earlier expiry may have taken it with its owner
                    self._delete(record, "Expired")
        self._now = max(self._now, target)
        return self._deletions[deleted:]

    def _next_event(self, target: datetime) -> datetime | None:
        moments = [r.settles_at for r in self._records.values() if r.phase in _CONVERGING]
        moments += [r.expires_at for r in self._records.values() if r.alive and r.expires_at is not None]
        due = [m for m in moments if m <= target]
        return min(due) if due else None

    # --- running pipelines -------------------------------------------------------------------

    def run(
        self, pipeline: Pipeline[InputT, OutputT], inputs: InputT | Mapping[str, Any] | None = None
    ) -> RunResult[OutputT]:
        """Run ``pipeline`` in-process to its end and return the result (it never raises for a
        failed run: look at ``status`` and ``error``, or call ``unwrap()``).

        ``inputs`` is the pipeline's input model, or a dict validated like an API start (a
        ``pydantic.ValidationError`` is raised at once, as the server refuses such a start).
        """
        if isinstance(inputs, BaseModel):
            if not isinstance(inputs, pipeline.inputs):
                raise TypeError(f"{pipeline.name} takes {pipeline.inputs.__name__}, not {type(inputs).__name__}")
            document: dict[str, Any] = inputs.model_dump(mode="json")
        else:  # as the API stores a start: the validated model, dumped to JSON
            document = pipeline.inputs.model_validate(dict(inputs or {})).model_dump(mode="json")
        return self._execute(pipeline, document, parent=None)

    def _new_id(self) -> str:
        # Deterministic, uuid-shaped ids: the same test makes the same ids every time.
        return str(uuid.UUID(int=next(self._ids), version=4))

    def _execute(
        self, pipeline: Pipeline[Any, OutputT], document: dict[str, Any], parent: RunResult[Any] | None
    ) -> RunResult[OutputT]:
        inputs = pipeline.inputs.model_validate(document)  # the engine validates the stored JSON
        run: RunResult[OutputT] = RunResult(
            run_id=self._new_id(),
            pipeline=pipeline.name,
            inputs=document,
            started_at=self._now,
            parent_run_id=parent.run_id if parent else None,
            _world=self,
        )
        self._runs[run.run_id] = run
        if parent is not None:
            parent.children.append(run)
        runtime = _Runtime(self, run, pipeline)
        status: RunStatus
        try:
            value = pipeline.fn(Context(runtime), inputs)
            run.output_json = self._output(pipeline, value)
            status = "succeeded"
        except _TimedOut:
            status = "timed_out"
            run.error = TimeoutError(f"run exceeded its deadline at {runtime.deadline}")
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # the engine fails the run on anything the function raises
            status = "failed"
            run.error = exc
        if status == "succeeded" and pipeline.output is not None and run.output_json is not None:
            run.output = pipeline.output.model_validate(run.output_json)  # type: ignore[assignment]
        elif status == "succeeded":
            run.output = run.output_json
        self._finish(run, status, pipeline.keep_on_failure)
        return run

    @staticmethod
    def _output(pipeline: Pipeline[Any, Any], value: Any) -> Any:
        if value is None:
            return None
        if pipeline.output is not None and not isinstance(value, pipeline.output):
            raise TypeError(
                f"{pipeline.name} must return {pipeline.output.__name__} or None, not {type(value).__name__}"
            )
        return _json(value)

    def _finish(self, run: RunResult[Any], status: RunStatus, keep_for: timedelta | None) -> None:
        """End the run: a failed run may hand its holdings to the stand, the rest is deleted."""
        run.status = status
        run.finished_at = self._now
        owner = f"run:{run.run_id}"
        if status == "failed" and keep_for:
            stand = f"stand:{run.pipeline}"
            for record in self._owned_by(owner):
                if self._clash(stand, record.kind, record.name) is None:
                    self._move(record, stand, expires_at=self._now + keep_for)
                # A name clash with an earlier holding: this part cannot be kept and is deleted
                # below (the stand's names are unique, as for any owner).
        reason = "Run" + status.title().replace("_", "")
        for record in reversed(self._owned_by(owner)):
            self._delete(record, reason)

    # --- records: the rules every runtime call goes through ----------------------------------

    def _owned_by(self, owner: str) -> list[Record]:
        """The live records ``owner`` owns directly, in order."""
        return sorted((r for r in self._records.values() if r.owner == owner and r.alive), key=lambda r: r.position)

    def _clash(self, owner: str, kind: str, name: str) -> Record | None:
        return next((r for r in self._owned_by(owner) if r.kind == kind and r.name == name), None)

    def _ancestors(self, record: Record) -> Iterator[Record]:
        owner = record.owner
        while owner.startswith("record:"):
            parent = self._records[owner.removeprefix("record:")]
            yield parent
            owner = parent.owner

    def _root(self, record: Record) -> str:
        """The run or stand at the top of the record's ownership chain."""
        *_, top = [record, *self._ancestors(record)]
        return top.owner

    def _chain(self, record: Record) -> str:
        parts = [f"{r.label} ({r.id})" for r in [record, *self._ancestors(record)]]
        return " <- ".join([*parts, self._describe(self._root(record))])

    def _describe(self, owner: str) -> str:
        if owner.startswith("run:"):
            run = self._runs.get(owner.removeprefix("run:"))
            return f"{owner} ({run.pipeline}, {run.status})" if run else owner
        if owner.startswith("record:"):
            record = self._records.get(owner.removeprefix("record:"))
            return f"{owner} ({record.label})" if record else owner
        return owner

    def _move(self, record: Record, owner: str, *, expires_at: datetime | None) -> None:
        record.owner = owner
        record.position = next(self._positions)  # arrives as its new owner's last record
        record.expires_at = expires_at

    def _delete(self, record: Record, reason: str) -> None:
        """Delete ``record``'s subtree: children before parents (newest sibling first)."""
        for child in reversed(self._owned_by(f"record:{record.id}")):
            self._delete(child, reason)
        record.phase = "deleted"
        record.deleted_at = self._now
        record.deletion_reason = reason
        self._deletions.append(record)

    def _converge(self, record: Record) -> None:
        behaviour = self._kinds.get(record.kind, _KindBehaviour())
        identity = {"id": record.id, "kind": record.kind, "name": record.name}
        if behaviour.fail:
            record.phase, record.error = "create_failed", behaviour.fail
            return
        if behaviour.outputs is None:
            outputs: dict[str, Any] = {**record.spec, **identity}
        else:
            try:
                outputs = {**identity, **behaviour.outputs(json.loads(json.dumps(record.spec)))}
            except Exception as exc:
                record.phase, record.error = "create_failed", f"{type(exc).__name__}: {exc}"
                return
        try:
            record.outputs = _json(outputs)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"the outputs of {record.label} are not JSON (check World.on_create): {exc}") from exc
        record.phase, record.error = "ready", ""

    def _declare(
        self,
        run: RunResult[Any],
        kind: str,
        name: str,
        spec: Mapping[str, Any],
        labels: Mapping[str, str],
        parent: str | None,
        children: Sequence[str],
    ) -> str:
        label = f"{kind}/{name}"

        def refuse(why: str) -> ResourceFailed:
            return ResourceFailed(f"cannot declare {label}: {why}")

        if kind in _ROOT_KINDS:
            raise refuse(f"{kind} records are roots and cannot be owned")
        if not kind:
            raise refuse("a kind is required")
        if not name or len(name) > 253:
            raise refuse("name must be 1-253 characters")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise refuse("labels must map strings to strings")
        try:
            document: dict[str, Any] = _json(dict(spec))
        except (TypeError, ValueError) as exc:
            raise refuse(f"the spec is not JSON: {exc}") from None
        root = f"run:{run.run_id}"
        owner = root
        if parent is not None:
            owner_record = self._records.get(parent)
            if owner_record is None:
                raise refuse(f"parent {parent} does not exist")
            if not owner_record.alive:
                raise refuse(f"parent {owner_record.label} ({parent}) is deleted; it cannot own new records")
            if self._root(owner_record) != root:
                raise refuse(f"parent {parent} is not a record owned by this run: {self._chain(owner_record)}")
            owner = f"record:{parent}"
        record = self._clash(owner, kind, name)
        given = self._check_children(label, root, parent, children)
        if record is not None:  # re-declaring: the same record, a new generation if the spec changed
            for child in given:  # (checked first: a refused declaration changes nothing)
                if child is record:
                    raise refuse("a record cannot own itself")
                if self._clash(f"record:{record.id}", child.kind, child.name) not in (None, child):
                    raise refuse(f"it already owns a live {child.label}")
            if (record.spec, record.labels) != (document, dict(labels)):
                record.spec, record.labels, record.generation = document, dict(labels), record.generation + 1
                self._start_converging(record, "updating" if record.phase == "ready" else "pending")
        else:
            record = Record(
                id=self._new_id(),
                kind=kind,
                name=name,
                spec=document,
                labels=dict(labels),
                owner=owner,
                declared_by=run.run_id,
                created_at=self._now,
                settles_at=self._now,
            )
            record.position = next(self._positions)
            self._records[record.id] = record
            self._start_converging(record, "pending")
        for child in given:
            if child.owner != f"record:{record.id}":
                self._move(child, f"record:{record.id}", expires_at=child.expires_at)
        return record.id

    def _check_children(self, label: str, root: str, parent: str | None, children: Sequence[str]) -> list[Record]:
        given: list[Record] = []
        chain: list[Record] = []
        if parent is not None:
            owner_record = self._records[parent]
            chain = [owner_record, *self._ancestors(owner_record)]
        for child_id in children:
            child = self._records.get(child_id)
            if child is None:
                raise ResourceFailed(f"cannot declare {label}: child {child_id} does not exist")
            if not child.alive:
                raise ResourceFailed(f"cannot declare {label}: child {child.label} ({child_id}) is deleted")
            if self._root(child) != root:
                raise ResourceFailed(
                    f"cannot declare {label}: child {child_id} is not a record owned by this run: {self._chain(child)}"
                )
            if child in chain:
                raise ResourceFailed(f"cannot declare {label}: its own ancestor {child.label} cannot be its child")
            if any(g.kind == child.kind and g.name == child.name for g in given):
                raise ResourceFailed(f"cannot declare {label}: two children are {child.label}")
            given.append(child)
        return given

    def _start_converging(self, record: Record, phase: Phase) -> None:
        behaviour = self._kinds.get(record.kind, _KindBehaviour())
        record.phase = phase
        record.settles_at = self._now + timedelta(seconds=behaviour.create_seconds)
        if behaviour.create_seconds == 0:
            self._converge(record)

    # --- inspection --------------------------------------------------------------------------

    @property
    def runs(self) -> list[RunResult[Any]]:
        """Every run so far (child runs too), in start order."""
        return list(self._runs.values())

    @property
    def deletions(self) -> list[Record]:
        """Every deleted record, in the order it was deleted (children before parents)."""
        return list(self._deletions)

    def get(self, record: HandleLike) -> Record:
        """The record behind a handle, a ``Record`` or a record id (deleted ones too)."""
        record_id = record if isinstance(record, str) else record.id
        found = self._records.get(record_id)
        if found is None:
            raise LookupError(f"no record {record_id} in this world")
        return found

    def records(
        self,
        *,
        kind: str | None = None,
        name: str | None = None,
        owner: OwnerLike | None = None,
        run: RunResult[Any] | str | None = None,
        include_deleted: bool = False,
    ) -> list[Record]:
        """Records (live ones unless ``include_deleted``), filtered by kind, name, direct
        ``owner`` (as in ``assert_owner``) and the ``run`` that declared them.
        """
        owner_key = self._owner_key(owner) if owner is not None else None
        run_id = run if isinstance(run, str) or run is None else run.run_id
        return [
            r
            for r in self._records.values()
            if (include_deleted or r.alive)
            and (kind is None or r.kind == kind)
            and (name is None or r.name == name)
            and (owner_key is None or r.owner == owner_key)
            and (run_id is None or r.declared_by == run_id)
        ]

    def record(self, name: str, *, kind: str | None = None, include_deleted: bool = False) -> Record:
        """The one record with this name (and kind); ``LookupError`` if none or several."""
        found = self.records(name=name, kind=kind, include_deleted=include_deleted)
        what = f"{'' if include_deleted else 'live '}record named {name!r}" + (f" of kind {kind}" if kind else "")
        return _exactly_one(found, what, self.records(include_deleted=include_deleted))

    def stand(self, pipeline: Pipeline[Any, Any] | str) -> list[Record]:
        """What the pipeline's stand holds directly (each with its ``expires_at``), in arrival order."""
        name = pipeline if isinstance(pipeline, str) else pipeline.name
        return self._owned_by(f"stand:{name}")

    def subtree(self, record: HandleLike) -> list[Record]:
        """The record and every live record below it, parents before children."""
        top = self.get(record)
        below = [r for child in self._owned_by(f"record:{top.id}") for r in self.subtree(child)]
        return [top, *below]

    # --- artifacts ---------------------------------------------------------------------------

    def put_artifact(
        self,
        pipeline: Pipeline[Any, Any] | str,
        name: str,
        data: bytes | str,
        *,
        content_type: str = "application/octet-stream",
        keep_for: timedelta | None = None,
    ) -> Record:
        """An artifact on ``pipeline``'s stand, as an upload would put it there (for a pipeline
        under test that attaches an artifact another pipeline published)."""
        stand = f"stand:{pipeline if isinstance(pipeline, str) else pipeline.name}"
        raw = data.encode() if isinstance(data, str) else bytes(data)
        sha256 = hashlib.sha256(raw).hexdigest()
        if self._clash(stand, "artifact", name) is not None:
            raise ValueError(f"{stand} already holds an artifact named {name!r}")
        self.blobs[sha256] = raw
        record = Record(
            id=self._new_id(),
            kind="artifact",
            name=name,
            spec={"name": name, "sha256": sha256, "size": len(raw), "content_type": content_type},
            labels={},
            owner=stand,
            declared_by="",
            created_at=self._now,
            settles_at=self._now,
            expires_at=self._now + keep_for if keep_for else None,
        )
        record.position = next(self._positions)
        self._records[record.id] = record
        self._start_converging(record, "pending")
        return record

    def artifact_bytes(self, artifact: HandleLike | ArtifactRef) -> bytes:
        """The bytes of an artifact (its record, handle, id or ``ArtifactRef``), deleted ones too."""
        record = self.get(artifact.id if isinstance(artifact, ArtifactRef) else artifact)
        if record.kind != "artifact":
            raise LookupError(f"{record.label} is not an artifact")
        return self.blobs[str(record.spec["sha256"])]

    # --- acting as an operator (what the API, CLI or Studio would do) -------------------------

    def extend(
        self,
        record: HandleLike,
        delta: timedelta | None = None,
        *,
        days: float = 0,
        hours: float = 0,
        minutes: float = 0,
        seconds: float = 0,
    ) -> Record:
        """Push a record's TTL further (from now if it had none), as ``POST .../extend/``."""
        target = self._alive(self.get(record), "extend")
        by = _delta(delta, days, hours, minutes, seconds)
        if by <= timedelta(0):
            raise ValueError("extend by a positive duration")
        target.expires_at = max(target.expires_at or self._now, self._now) + by
        return target

    def release(self, record: HandleLike) -> Record:
        """Remove a record's TTL: it stays until deleted, as ``POST .../release/``."""
        target = self._alive(self.get(record), "release")
        target.expires_at = None
        return target

    def delete(self, record: HandleLike) -> list[Record]:
        """Delete a record's subtree now; returns what was deleted, in order."""
        target = self._alive(self.get(record), "delete")
        before = len(self._deletions)
        self._delete(target, "DeletedByUser")
        return self._deletions[before:]

    @staticmethod
    def _alive(record: Record, action: str) -> Record:
        if not record.alive:
            raise ValueError(f"cannot {action} {record.label} ({record.id}): it is deleted")
        return record

    # --- assertions --------------------------------------------------------------------------

    def assert_no_leaks(self) -> None:
        """Nothing is left that a finished run owns (directly or below its records).

        What a stand holds is not a leak: it was handed over on purpose and its TTL (if any)
        will delete it. Records of runs still running are not checked.
        """
        leaks = []
        for record in self._records.values():
            if not record.alive:
                continue
            root = self._root(record)
            run = self._runs.get(root.removeprefix("run:")) if root.startswith("run:") else None
            dead_parent = any(not a.alive for a in self._ancestors(record))
            if dead_parent or (run is not None and run.status != "running"):
                leaks.append(f"  {self._chain(record)} [{record.phase}]")
        if leaks:
            raise AssertionError(f"{len(leaks)} record(s) outlived their owner:\n" + "\n".join(leaks))

    def assert_owner(self, record: HandleLike, owner: OwnerLike) -> None:
        """``record`` is alive and directly owned by ``owner``.

        ``owner``: a handle or ``Record`` (a record owner), a ``RunResult`` (a run), a
        ``Pipeline`` or ``"stand:<pipeline>"`` (that pipeline's stand), ``"run:<id>"`` or
        ``"record:<id>"``.
        """
        target = self.get(record)
        expected = self._owner_key(owner)
        if not target.alive:
            raise AssertionError(
                f"{target.label} ({target.id}) was deleted at {target.deleted_at} ({target.deletion_reason}); "
                f"expected it to be owned by {self._describe(expected)}"
            )
        if target.owner != expected:
            raise AssertionError(
                f"{target.label} is owned by {self._describe(target.owner)}, not {self._describe(expected)}; "
                f"ownership: {self._chain(target)}"
            )

    def _owner_key(self, owner: OwnerLike) -> str:
        if isinstance(owner, RunResult):
            return f"run:{owner.run_id}"
        if isinstance(owner, Pipeline):
            return f"stand:{owner.name}"
        if isinstance(owner, Resource | Attached | Record):
            return f"record:{owner.id}"
        if owner.startswith(("run:", "record:", "stand:")) and owner.partition(":")[2]:
            return owner
        raise ValueError(f"owner {owner!r}: use 'stand:<pipeline>', 'run:<id>', 'record:<id>', a handle or a run")


class _Runtime:
    """The ``Runtime`` behind a run's ``Context`` in the world (see ``graphene_sdk._context``)."""

    def __init__(self, world: World, run: RunResult[Any], pipeline: Pipeline[Any, Any]) -> None:
        self.run_id = run.run_id
        self._world = world
        self._run = run
        self._pipeline = pipeline
        self.deadline = run.started_at + pipeline.timeout if pipeline.timeout else None

    def _check(self) -> None:
        if self._run.status != "running":
            raise RuntimeError(f"run {self.run_id} has ended ({self._run.status}); its Context cannot be used")
        if self.deadline is not None and self._world.now >= self.deadline:
            raise _TimedOut

    def _wait_until(self, moment: datetime) -> None:
        """What a suspended run lives through: the clock moves; past the deadline the run ends."""
        if self.deadline is not None and moment >= self.deadline:
            self._world._advance_to(self.deadline)
            raise _TimedOut
        self._world._advance_to(moment)

    def _record(self, record_id: str, label: str, action: str) -> Record:
        record = self._world._records.get(record_id)
        if record is None:
            raise ResourceFailed(f"cannot {action} {label}: record {record_id} does not exist", record_id=record_id)
        return record

    def declare(
        self,
        kind: str,
        name: str,
        spec: Mapping[str, Any],
        labels: Mapping[str, str],
        parent: str | None,
        children: Sequence[str],
        drift: Mapping[str, Any] | None = None,
    ) -> str:
        self._check()
        return self._world._declare(self._run, kind, name, spec, labels, parent, children)

    def attach(self, record_id: str) -> tuple[str, str]:
        self._check()
        record = self._record(record_id, "a record", "attach")
        return record.kind, record.name

    def to_stand(self, record_id: str, label: str, keep_for: float | None) -> None:
        self._check()
        world = self._world
        record = self._record(record_id, label, "hand over")
        stand = f"stand:{self._pipeline.name}"
        if not record.alive:
            raise ResourceFailed(f"cannot hand {label} to the stand: it is deleted", record_id=record_id)
        if keep_for is not None and keep_for <= 0:
            raise ValueError("keep_for must be positive")
        expires_at = world.now + timedelta(seconds=keep_for) if keep_for is not None else None
        if record.owner == stand:  # handed over before: this sets its TTL again
            record.expires_at = expires_at
            return
        if world._root(record) != f"run:{self.run_id}":
            raise ResourceFailed(
                f"cannot hand {label} to the stand: it is not owned by this run: {world._chain(record)}",
                record_id=record_id,
            )
        if world._clash(stand, record.kind, record.name) is not None:
            raise ResourceFailed(
                f"cannot hand {label} to the stand: {stand} already holds a live {label}", record_id=record_id
            )
        world._move(record, stand, expires_at=expires_at)

    def ready(self, record_id: str, label: str) -> tuple[dict[str, Any] | None, ResourceFailed | None]:
        self._check()
        record = self._world._records.get(record_id)
        if record is None:
            return None, ResourceFailed(f"{label}: record {record_id} does not exist", record_id=record_id)
        if record.phase in _CONVERGING:
            self._wait_until(record.settles_at)  # the engine suspends the run here
        if record.phase == "ready" and record.kind == "agent" and record.spec.get("needs"):
            unmet = self._world._unmet(record, record.spec["needs"])
            if unmet:  # the real system waits for a publish; nothing else publishes in the world
                message = (
                    f"{label} is connected but its machine does not publish {unmet}: publish them first "
                    "(ctx.publish_capability) or declare the machine with World.add_agent(..., capabilities=...)"
                )
                return None, ResourceFailed(message, record_id=record_id, phase="creating")
        if record.phase == "ready":
            return _json(record.outputs), None
        why = record.error if record.phase == "create_failed" else record.deletion_reason
        message = f"{label} is {record.phase}: {why}".rstrip(": ")
        return None, ResourceFailed(message, record_id=record_id, phase=record.phase)

    def delete(self, record_id: str, label: str) -> None:
        self._check()
        record = self._world._records.get(record_id)
        if record is not None and record.alive:  # deleting is idempotent
            self._world._delete(record, "DeletedByRun")

    def agent(self, name: str, labels: Mapping[str, str], needs: list[dict[str, Any]]) -> str:
        self._check()
        return self._world._declare(self._run, "agent", name, {"needs": needs} if needs else {}, labels, None, ())

    def agent_install(self, record_id: str, form: Literal["env", "script"]) -> str:
        self._check()
        self._record(record_id, "agent", "install")
        token = "GRAPHENE_AGENT_BOOTSTRAP_TOKEN=testing-kit-token"  # noqa: S105 - a fake, nothing connects
        return f"{token}\n" if form == "env" else f"#!/bin/sh\n# testing kit: no agent is installed\n# {token}\n"

    def agent_via_ssh(self, name: str, labels: Mapping[str, str], target: Mapping[str, Any]) -> str:
        # Nothing is installed in the world (and no secret store is consulted): the agent
        # record is declared, and the call returns once it is ready, as the engine's does.
        self._check()
        self._world.ssh_installs.append((name, dict(target)))
        record_id = self._world._declare(self._run, "agent", name, {}, labels, None, ())
        _, error = self.ready(record_id, f"agent/{name}")
        if error is not None:
            raise error
        return record_id

    def agent_exec(
        self,
        record_id: str,
        label: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None,
        timeout: float | None,
        guarantee: Literal["at_least_once", "at_most_once"],
    ) -> dict[str, Any]:
        self._check()
        record = self._record(record_id, label, "run a command on")
        if not record.alive:
            raise ResourceFailed(f"cannot run a command on {label}: it is deleted", record_id=record_id)
        self._world.commands.append((record.name, list(argv)))
        exit_code, stdout, stderr = self._world._exec(record.name, list(argv))
        return {"exit_code": exit_code, "stdout_tail": stdout, "stderr_tail": stderr}

    def attach_agent(self, name_or_id: str, needs: list[dict[str, Any]]) -> dict[str, Any]:
        self._check()
        live = [r for r in self._world._records.values() if r.kind == "agent" and r.alive]
        found = [r for r in live if name_or_id in (r.id, r.name)]
        if not found:
            raise ResourceFailed(f"cannot attach agent {name_or_id}: no live agent has that name or id")
        if len(found) > 1:
            raise ResourceFailed(f"cannot attach agent {name_or_id}: {len(found)} agents have that name; pass the id")
        unmet = self._world._unmet(found[0], needs)
        if unmet:
            raise ResourceFailed(f"cannot attach agent {name_or_id}: it does not meet the needs {unmet}")
        return {"record_id": found[0].id, "name": found[0].name}

    def select_agents(self, labels: Mapping[str, str], needs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self._check()
        chosen = [
            r
            for r in self._world._records.values()
            if r.kind == "agent"
            and r.alive
            and all(r.labels.get(k) == v for k, v in labels.items())
            and not self._world._unmet(r, needs)
        ]
        return [{"record_id": r.id, "name": r.name} for r in sorted(chosen, key=lambda r: (r.name, r.id))]

    def publish_capability(
        self, record_id: str, label: str, name: str, version: str, labels: Mapping[str, str]
    ) -> None:
        self._check()
        record = self._agent(record_id, label)
        self._world.capabilities.setdefault(record.id, {})[name] = (version, dict(labels))

    def _agent(self, record_id: str, label: str) -> Record:
        record = self._record(record_id, label, "act on")
        if not record.alive:
            raise ResourceFailed(f"cannot act on {label}: it is deleted", record_id=record_id)
        return record

    def agent_put_file(self, record_id: str, label: str, path: str, data: bytes, mode: int) -> dict[str, Any]:
        self._check()
        record = self._agent(record_id, label)
        self._world.files.setdefault(record.name, {})[path] = bytes(data)
        return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def agent_get_file(self, record_id: str, label: str, path: str, max_bytes: int) -> bytes:
        self._check()
        record = self._agent(record_id, label)
        data = self._world.files.get(record.name, {}).get(path)
        if data is None:
            raise ResourceFailed(
                f"get_file {path} on {label} failed: cannot read {path}: No such file or directory "
                "(the world's machines hold only what put_file wrote)",
                record_id=record_id,
            )
        if len(data) > max_bytes:
            raise ResourceFailed(
                f"get_file {path} on {label} failed: {path} is {len(data)} bytes; get_file returns at most {max_bytes}",
                record_id=record_id,
            )
        return data

    def agent_call(
        self, record_id: str, label: str, call: RemoteCall, timeout: float | None, guarantee: Guarantee
    ) -> Any:
        # ``timeout`` is not simulated (the function runs to its end), nor is ``guarantee``.
        self._check()
        record = self._agent(record_id, label)
        self._world.calls.append((record.name, call.name, list(call.args), dict(call.kwargs)))
        handler = self._world._call
        try:
            value = handler(record.name, call.name, call.args, call.kwargs) if handler else run_source(call)
        except Exception as exc:
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:  # the world's own frames
                tb = tb.tb_next
            remote_traceback = "".join(traceback.format_exception(type(exc), exc, tb))
            raise self._remote_error(record_id, label, call, type(exc).__name__, str(exc), remote_traceback) from exc
        try:
            encoded = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            message = f"the result of {call.name}() is not JSON-serializable: {exc}"
            raise self._remote_error(record_id, label, call, "TypeError", message, "") from None
        if len(encoded.encode()) > MAX_CALL_RESULT_BYTES:
            message = (
                f"the result is {len(encoded.encode())} bytes of JSON; a call returns at most {MAX_CALL_RESULT_BYTES}"
            )
            raise self._remote_error(record_id, label, call, "ValueError", message, "")
        return json.loads(encoded)

    @staticmethod
    def _remote_error(
        record_id: str, label: str, call: RemoteCall, kind: str, message: str, remote_traceback: str
    ) -> RemoteError:
        return RemoteError(
            f"{call.name}() on {label} raised {kind}: {message}",
            function=call.name,
            remote_type=kind,
            remote_message=message,
            remote_traceback=remote_traceback,
            record_id=record_id,
        )

    def run_children(
        self, pipeline: Pipeline[Any, Any], inputs: Sequence[dict[str, Any]], concurrency: int
    ) -> list[Any]:
        # One after another, which honours any concurrency limit; each child is owned by this
        # run and has ended (its records deleted, unless handed to its stand) when this returns.
        self._check()
        children = [self._world._execute(pipeline, dict(item), parent=self._run) for item in inputs]
        failures = {child.run_id: child.error_text or child.status for child in children if not child.succeeded}
        self._check()
        if failures:
            raise ChildRunFailed(
                f"{len(failures)} of {len(children)} child run(s) of {pipeline.name} did not succeed: "
                + "; ".join(f"{run_id}: {text}" for run_id, text in failures.items()),
                failures=failures,
            )
        return [child.output_json for child in children]

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        guarantee: Guarantee,
        timeout: float | None,
        retries: int,
    ) -> Any:
        # ``guarantee`` only matters after a crash, which the world does not simulate.
        self._check()
        attempt = 0
        while True:
            attempt += 1
            error: Exception
            began = time.perf_counter()
            try:
                value = fn(*args, **kwargs)
            except Exception as exc:
                error = exc
            else:
                if timeout is not None and time.perf_counter() - began > timeout:
                    # The engine would have abandoned the step at its timeout; here it ran to
                    # its end first, but the outcome for the run is the same.
                    error = StepTimeout(
                        f"step {name!r} timed out after {timeout:g}s", step=name, error_type="StepTimeout"
                    )
                else:
                    try:
                        return _json(value)
                    except (TypeError, ValueError) as exc:
                        error = TypeError(f"step {name!r} returned a value that cannot be journaled: {exc}")
            if attempt > retries:
                if isinstance(error, StepTimeout):
                    raise StepTimeout(str(error), step=name, error_type="StepTimeout") from error
                text = f"step {name!r} failed: {type(error).__name__}: {error}"
                raise StepFailed(text, step=name, error_type=type(error).__name__) from error
            pause = min(self._world.retry_base_seconds * 2 ** (attempt - 1), _MAX_BACKOFF_SECONDS)
            self._wait_until(self._world.now + timedelta(seconds=pause))

    def sleep(self, seconds: float) -> None:
        self._check()
        self._wait_until(self._world.now + timedelta(seconds=seconds))

    def log(self, message: str, level: str) -> None:
        # No deadline check: in the engine a log line is not a journaled call.
        if self._run.status != "running":
            raise RuntimeError(f"run {self.run_id} has ended ({self._run.status}); its Context cannot be used")
        self._run.logs.append(LogLine(at=self._world.now, level=level, message=message))

    # Artifacts: as in the engine, a published artifact is handed to the stand at once, its
    # record named ``<name>@run-<n>`` (n: the run's number among its pipeline's runs).
    def publish_artifact(
        self, name: str, data: bytes | Path, content_type: str | None, keep_for: float | None, labels: Mapping[str, str]
    ) -> dict[str, Any]:
        self._check()
        world = self._world
        raw = data if isinstance(data, bytes) else Path(data).read_bytes()
        sha256 = hashlib.sha256(raw).hexdigest()
        spec = {
            "name": name,
            "sha256": sha256,
            "size": len(raw),
            "content_type": content_type or mimetypes.guess_type(name)[0] or "application/octet-stream",
        }
        number = [r.run_id for r in world._runs.values() if r.pipeline == self._pipeline.name].index(self.run_id) + 1
        stand, record_name = f"stand:{self._pipeline.name}", f"{name}@run-{number}"
        expires_at = world.now + timedelta(seconds=keep_for) if keep_for else None
        record = world._clash(stand, "artifact", record_name)
        if record is not None:
            if record.spec["sha256"] != sha256:
                raise ResourceFailed(
                    f"cannot publish artifact {name!r}: artifact {name!r} of this run already exists with other content"
                )
            if record.expires_at is not None and (expires_at is None or expires_at > record.expires_at):
                record.expires_at = expires_at
        else:
            record = world._records[world._declare(self._run, "artifact", record_name, spec, labels, None, ())]
            world._move(record, stand, expires_at=expires_at)
        world.blobs[sha256] = raw
        return {"id": record.id, **record.spec}

    def attach_artifact(self, name_or_id: str, pipeline: str | None) -> dict[str, Any]:
        self._check()
        world = self._world
        stand = f"stand:{pipeline or self._pipeline.name}"
        found = [
            r
            for r in world._records.values()
            if r.kind == "artifact"
            and r.alive
            and (r.id == name_or_id or (r.spec.get("name") == name_or_id and world._root(r) == stand))
        ]
        if not found:
            raise ResourceFailed(
                f"cannot attach artifact {name_or_id!r} on the {stand}: "
                "none is live (never published, deleted or expired)"
            )
        record = found[-1]  # the newest (records are kept in creation order)
        return {"id": record.id, **record.spec}

    def read_artifact(self, artifact_id: str) -> bytes:
        record = self._world._records.get(artifact_id)
        if record is None or record.kind != "artifact" or not record.alive:
            raise ResourceFailed(f"cannot read artifact {artifact_id}: it does not exist or was deleted")
        return self._world.blobs[str(record.spec["sha256"])]
