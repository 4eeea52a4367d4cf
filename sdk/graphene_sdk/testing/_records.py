"""The records rules of the world: ownership, declaration, convergence and deletion.

Every runtime call and every operator action goes through these, as through the services
of the real system: one owner per record, children deleted before their parents.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from graphene_sdk._errors import ResourceFailed
from graphene_sdk.testing._results import Phase, Record, RunResult

OutputsFn = Callable[[dict[str, Any]], Mapping[str, Any]]

# Kinds that are roots of their own trees in the real system: nothing can own them.
_ROOT_KINDS = frozenset({"graphene.run", "graphene.stand", "graphene.sweeper"})
CONVERGING: frozenset[str] = frozenset({"pending", "updating"})


@dataclass
class KindBehaviour:
    fail: str = ""
    create_seconds: float = 0.0
    outputs: OutputsFn | None = None


def to_json(value: Any) -> Any:
    """The JSON form the engine journals and returns (pydantic models are dumped first)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return json.loads(json.dumps(value))


def _refused(label: str, why: str) -> ResourceFailed:
    return ResourceFailed(f"cannot declare {label}: {why}")


class RecordRules:
    """The world's store (records, runs, the clock's reading) and the rules that change it.

    ``World`` builds on it; the runtime and the operator actions call these rules.
    """

    def __init__(self, now: datetime) -> None:
        self._now = now
        self._ids = itertools.count(1)
        self._positions = itertools.count(1)
        self._records: dict[str, Record] = {}
        self._runs: dict[str, RunResult[Any]] = {}
        self._kinds: dict[str, KindBehaviour] = {}
        self._deletions: list[Record] = []

    def _new_id(self) -> str:
        # Deterministic, uuid-shaped ids: the same test makes the same ids every time.
        return str(uuid.UUID(int=next(self._ids), version=4))

    def _insert(
        self, *, kind: str, name: str, spec: dict[str, Any], labels: dict[str, str], owner: str, declared_by: str
    ) -> Record:
        """A new record, created now (phase ``pending``), as its owner's last record."""
        record = Record(
            id=self._new_id(),
            kind=kind,
            name=name,
            spec=spec,
            labels=labels,
            owner=owner,
            declared_by=declared_by,
            created_at=self._now,
            settles_at=self._now,
        )
        record.position = next(self._positions)
        self._records[record.id] = record
        return record

    def _owned_by(self, owner: str) -> list[Record]:
        """The live records ``owner`` owns directly, in order."""
        return sorted((r for r in self._records.values() if r.owner == owner and r.alive), key=lambda r: r.position)

    def _live(self, kind: str) -> list[Record]:
        """The live records of ``kind``, oldest first."""
        return [r for r in self._records.values() if r.kind == kind and r.alive]

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

    def _delete(self, record: Record, reason: str) -> bool:
        """Delete ``record``'s subtree: children before parents (newest sibling first).

        A protected record stops it: it and what it owns stay, and so do its owners (their
        ``deletion_waiting`` says why) until it is unprotected. Returns whether ``record`` went.
        """
        if record.protected:
            self._hold(record, reason)
            return False
        gone = True
        for child in reversed(self._owned_by(f"record:{record.id}")):
            gone = self._delete(child, reason) and gone
        if not gone:
            record.deletion_waiting = record.deletion_waiting or reason
            return False
        record.phase = "deleted"
        record.deleted_at = self._now
        record.deletion_reason = reason
        record.deletion_waiting = ""
        self._deletions.append(record)
        return True

    def _hold(self, record: Record, reason: str) -> None:
        """A deletion reached the protected ``record``: it and its subtree wait, as they are."""
        record.deletion_waiting = record.deletion_waiting or reason
        for child in self._owned_by(f"record:{record.id}"):
            self._hold(child, reason)

    def _unprotect(self, record: Record) -> None:
        """Remove the protection; a deletion that waited on it goes on, up its owners."""
        record.protected = False
        waiting: Record | None = record
        while waiting is not None and waiting.deletion_waiting:
            if not self._delete(waiting, waiting.deletion_waiting):
                return  # another protected record holds it
            owner = waiting.owner
            waiting = self._records[owner.removeprefix("record:")] if owner.startswith("record:") else None

    def _converge(self, record: Record) -> None:
        behaviour = self._kinds.get(record.kind, KindBehaviour())
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
            record.outputs = to_json(outputs)
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
        protect: bool = False,
    ) -> str:
        label = f"{kind}/{name}"
        if kind in _ROOT_KINDS:
            raise _refused(label, f"{kind} records are roots and cannot be owned")
        if not kind:
            raise _refused(label, "a kind is required")
        if not name or len(name) > 253:
            raise _refused(label, "name must be 1-253 characters")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise _refused(label, "labels must map strings to strings")
        try:
            document: dict[str, Any] = to_json(dict(spec))
        except (TypeError, ValueError) as exc:
            raise _refused(label, f"the spec is not JSON: {exc}") from None
        root = f"run:{run.run_id}"
        owner_record = None
        if parent is not None:
            owner_record = self._run_owned(label, "parent", parent, root, deleted="; it cannot own new records")
        if owner_record is not None and owner_record.deletion_waiting:
            raise _refused(
                label, f"parent {owner_record.label} ({owner_record.id}) is being deleted; it cannot own new records"
            )
        owner = root if owner_record is None else f"record:{owner_record.id}"
        record = self._clash(owner, kind, name)
        if protect and record is not None and record.deletion_waiting:
            raise _refused(label, "it is being deleted; protection keeps a deletion from starting, not one under way")
        given = self._check_children(label, root, owner_record, children)
        if record is not None:  # re-declaring: the same record, a new generation if the spec changed
            for child in given:  # (checked first: a refused declaration changes nothing)
                if child is record:
                    raise _refused(label, "a record cannot own itself")
                if self._clash(f"record:{record.id}", child.kind, child.name) not in (None, child):
                    raise _refused(label, f"it already owns a live {child.label}")
            if (record.spec, record.labels) != (document, dict(labels)):
                record.spec, record.labels, record.generation = document, dict(labels), record.generation + 1
                self._start_converging(record, "updating" if record.phase == "ready" else "pending")
        else:
            record = self._insert(
                kind=kind, name=name, spec=document, labels=dict(labels), owner=owner, declared_by=run.run_id
            )
            self._start_converging(record, "pending")
        for child in given:
            if child.owner != f"record:{record.id}":
                self._move(child, f"record:{record.id}", expires_at=child.expires_at)
        record.protected = record.protected or protect  # a declaration only adds protection
        return record.id

    def _check_children(self, label: str, root: str, parent: Record | None, children: Sequence[str]) -> list[Record]:
        given: list[Record] = []
        chain = [] if parent is None else [parent, *self._ancestors(parent)]
        for child_id in children:
            child = self._run_owned(label, "child", child_id, root)
            if child in chain:
                raise _refused(label, f"its own ancestor {child.label} cannot be its child")
            if any(g.kind == child.kind and g.name == child.name for g in given):
                raise _refused(label, f"two children are {child.label}")
            given.append(child)
        return given

    def _run_owned(self, label: str, role: str, record_id: str, root: str, *, deleted: str = "") -> Record:
        """The live record a declaration names as its ``role`` (parent or child): one that the
        run ``root`` owns, directly or below its records. Otherwise the declaration is refused."""
        record = self._records.get(record_id)
        if record is None:
            raise _refused(label, f"{role} {record_id} does not exist")
        if not record.alive:
            raise _refused(label, f"{role} {record.label} ({record_id}) is deleted{deleted}")
        if self._root(record) != root:
            raise _refused(label, f"{role} {record_id} is not a record owned by this run: {self._chain(record)}")
        return record

    def _start_converging(self, record: Record, phase: Phase) -> None:
        behaviour = self._kinds.get(record.kind, KindBehaviour())
        record.phase = phase
        record.settles_at = self._now + timedelta(seconds=behaviour.create_seconds)
        if behaviour.create_seconds == 0:
            self._converge(record)
