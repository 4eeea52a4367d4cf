"""``World``: the in-memory Graphene a pipeline runs against in a test."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from graphene_sdk._artifacts import ArtifactRef
from graphene_sdk._context import Context
from graphene_sdk._handles import Attached, Resource
from graphene_sdk._pipeline import InputT, OutputT, Pipeline
from graphene_sdk.testing._machines import Machines
from graphene_sdk.testing._records import CONVERGING, KindBehaviour, OutputsFn, to_json
from graphene_sdk.testing._results import Record, RunResult, RunStatus, exactly_one
from graphene_sdk.testing._runtime import TimedOut, WorldRuntime
from graphene_sdk.validation import validate_inputs

# What the inspection and assertion methods accept as a record, and as an owner.
HandleLike = Resource | Attached | Record | str
OwnerLike = Resource | Attached | Record | RunResult[Any] | Pipeline[Any, Any] | str


def _delta(value: timedelta | None, days: float, hours: float, minutes: float, seconds: float) -> timedelta:
    return (value or timedelta()) + timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


def _may_expire(record: Record) -> bool:
    """Alive, and no deletion waits on it already (a protected record whose TTL ran out stays)."""
    return record.alive and not record.deletion_waiting


def _stand(pipeline: Pipeline[Any, Any] | str) -> str:
    """The owner key of the pipeline's stand."""
    return f"stand:{pipeline if isinstance(pipeline, str) else pipeline.name}"


class World(Machines):
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
        super().__init__(start or datetime(2030, 1, 1, tzinfo=UTC))
        self.retry_base_seconds = retry_base_seconds
        # The blob store: artifacts' bytes by sha256 (``ctx.publish_artifact``, ``put_artifact``).
        self.blobs: dict[str, bytes] = {}

    # --- configuration (agents and their machines: see ``Machines``) -------------------------

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
        self._kinds[name] = KindBehaviour(fail=message, create_seconds=float(create_seconds), outputs=outputs)

    def on_create(self, kind: str, outputs: OutputsFn) -> None:
        """Compute the outputs of ``kind``'s records from their spec: ``outputs(spec) -> dict``.

        Outputs are ``{"id", "kind", "name"}`` plus what it returns; if it raises, the record
        fails with that error (so one function can fail some records and not others). Without
        it, outputs echo the spec plus ``id``, ``kind`` and ``name``.
        """
        if not kind:
            raise ValueError("a kind needs a name")
        self._kinds.setdefault(kind, KindBehaviour()).outputs = outputs

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
            for record in [r for r in self._records.values() if r.phase in CONVERGING]:
                if record.settles_at <= self._now:
                    self._converge(record)
            due = [
                r
                for r in self._records.values()
                if _may_expire(r) and r.expires_at is not None and r.expires_at <= self._now
            ]
            for record in sorted(due, key=lambda r: (r.expires_at, r.position)):
                if _may_expire(record):  # an earlier expiry may have taken it with its owner
                    self._delete(record, "Expired")
        self._now = max(self._now, target)
        return self._deletions[deleted:]

    def _next_event(self, target: datetime) -> datetime | None:
        moments = [r.settles_at for r in self._records.values() if r.phase in CONVERGING]
        moments += [r.expires_at for r in self._records.values() if _may_expire(r) and r.expires_at is not None]
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
        else:  # as the API stores a start: the validated model (by the server's rules), dumped to JSON
            document = validate_inputs(pipeline.inputs, dict(inputs or {})).model_dump(mode="json")
        return self._execute(pipeline, document, parent=None)

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
        runtime = self._runtime_for(run, pipeline)
        status: RunStatus
        try:
            value = pipeline.fn(Context(runtime), inputs)
            run.output_json = self._output(pipeline, value)
            status = "succeeded"
        except TimedOut:
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

    def _runtime_for(self, run: RunResult[Any], pipeline: Pipeline[Any, Any]) -> WorldRuntime:
        """The runtime behind the run's Context (a plan's recording pass records instead)."""
        return WorldRuntime(self, run, pipeline)

    @staticmethod
    def _output(pipeline: Pipeline[Any, Any], value: Any) -> Any:
        if value is None:
            return None
        if pipeline.output is not None and not isinstance(value, pipeline.output):
            raise TypeError(
                f"{pipeline.name} must return {pipeline.output.__name__} or None, not {type(value).__name__}"
            )
        return to_json(value)

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
        return exactly_one(found, what, self.records(include_deleted=include_deleted))

    def stand(self, pipeline: Pipeline[Any, Any] | str) -> list[Record]:
        """What the pipeline's stand holds directly (each with its ``expires_at``), in arrival order."""
        return self._owned_by(_stand(pipeline))

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
        stand = _stand(pipeline)
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if self._clash(stand, "artifact", name) is not None:
            raise ValueError(f"{stand} already holds an artifact named {name!r}")
        spec = self._artifact_spec(name, raw, content_type)
        self.blobs[spec["sha256"]] = raw
        record = self._insert(kind="artifact", name=name, spec=spec, labels={}, owner=stand, declared_by="")
        record.expires_at = self._now + keep_for if keep_for else None
        self._start_converging(record, "pending")
        return record

    def artifact_bytes(self, artifact: HandleLike | ArtifactRef) -> bytes:
        """The bytes of an artifact (its record, handle, id or ``ArtifactRef``), deleted ones too."""
        record = self.get(artifact.id if isinstance(artifact, ArtifactRef) else artifact)
        if record.kind != "artifact":
            raise LookupError(f"{record.label} is not an artifact")
        return self._blob(record)

    @staticmethod
    def _artifact_spec(name: str, raw: bytes, content_type: str) -> dict[str, Any]:
        """An artifact record's spec (an upload's or a publish's); the bytes go to ``blobs``."""
        sha256 = hashlib.sha256(raw).hexdigest()
        return {"name": name, "sha256": sha256, "size": len(raw), "content_type": content_type}

    def _blob(self, artifact: Record) -> bytes:
        return self.blobs[str(artifact.spec["sha256"])]

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
        """Delete a record's subtree now; returns what was deleted, in order. A protected
        record stops it there (it, what it owns and its owners stay: ``deletion_waiting``)."""
        target = self._alive(self.get(record), "delete")
        before = len(self._deletions)
        self._delete(target, "DeletedByUser")
        return self._deletions[before:]

    def protect(self, record: HandleLike) -> Record:
        """Protect a record, as ``POST .../protect/``: a deletion that reaches it stops there."""
        target = self._alive(self.get(record), "protect")
        if target.deletion_waiting:
            raise ValueError(f"cannot protect {target.label} ({target.id}): it is being deleted")
        target.protected = True
        return target

    def unprotect(self, record: HandleLike) -> list[Record]:
        """Remove a record's protection, as ``POST .../unprotect/``; a deletion that waited on
        it goes on. Returns what that deleted, in order (children before parents)."""
        target = self._alive(self.get(record), "unprotect")
        before = len(self._deletions)
        self._unprotect(target)
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
        will delete it; nor is what a protected record keeps (``deletion_waiting``: it, what it
        owns and its owners wait for an unprotect). Records of runs still running are not checked.
        """
        leaks = []
        for record in self._records.values():
            if not record.alive or record.deletion_waiting:
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
            return _stand(owner)
        if isinstance(owner, Resource | Attached | Record):
            return f"record:{owner.id}"
        if owner.startswith(("run:", "record:", "stand:")) and owner.partition(":")[2]:
            return owner
        raise ValueError(f"owner {owner!r}: use 'stand:<pipeline>', 'run:<id>', 'record:<id>', a handle or a run")
