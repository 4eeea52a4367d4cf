"""Kinds that exist to exercise the machinery: ``test.sleep`` and ``test.flaky``.

Their external world is a directory (``GRAPHENE_TEST_WORLD_DIR``): each object is a file
``<world>/<kind>/<record id>/<object id>``, so the number of objects made for a record is
simply the number of files in its directory, which is how crash tests count duplicates and
orphans. Create adopts an existing object of the record instead of making a second one.
"""

from __future__ import annotations

import contextlib
import fcntl
import random
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from django.conf import settings

from kinds import Kind, KindError, Marked, Observed, PermanentError

if TYPE_CHECKING:
    from apps.records.models import Record


def world() -> Path:
    return Path(settings.GRAPHENE_TEST_WORLD_DIR)


def _objects_in(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    except FileNotFoundError:
        return []


def gate_path(name: str) -> Path:
    """The file of the gate ``name`` (``gate_close``, ``gate_wait``)."""
    return world() / "gates" / name


class Gate:
    """A closed gate: work that waits on its name (``gate_wait``) blocks until ``open()``.
    Crash tests and benchmarks hold convergences and steps in flight with one, then let the
    resumed ones through. The closer holds an exclusive lock on the gate's file; a waiter takes
    a shared one, so it blocks in the kernel instead of polling."""

    def __init__(self, name: str) -> None:
        self.name = name
        path = gate_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a")
        fcntl.flock(self._file, fcntl.LOCK_EX)

    def open(self) -> None:
        """Let every waiter through; later waiters do not wait (the file is gone)."""
        gate_path(self.name).unlink(missing_ok=True)
        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()


def gate_close(name: str) -> Gate:
    return Gate(name)


def gate_wait(name: str) -> None:
    """Block while the gate ``name`` is closed (return at once if it is not)."""
    try:
        file = gate_path(name).open()
    except FileNotFoundError:
        return
    with file:
        fcntl.flock(file, fcntl.LOCK_SH)


def objects_of(record_id: str) -> list[Path]:
    """Every object made for the record, by any test kind (what tests count)."""
    base = world()
    kinds = [p for p in base.iterdir() if p.is_dir()] if base.is_dir() else []
    return [obj for kind_dir in kinds for obj in _objects_in(kind_dir / record_id)]


class SleepKind(Kind):
    name = "test.sleep"
    description = "A test object: it appears at once, is ready create_ms later, and takes delete_ms to delete."
    drift_interval = None  # exercises create and delete; drift is tested on real kinds (file)
    spec_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "create_ms": {"type": "integer", "minimum": 0, "maximum": 600_000, "default": 0},
            "delete_ms": {"type": "integer", "minimum": 0, "maximum": 600_000, "default": 0},
            "value": {"description": "any JSON value, echoed in the outputs"},
            "gate": {
                "type": "string",
                "pattern": "^[A-Za-z0-9_-]{1,64}$",
                "description": "create waits (after making the object) while the gate of that name is closed "
                "(kinds.testing.gate_close)",
            },
        },
        "additionalProperties": False,
    }

    def _folder(self, record_id: str) -> Path:
        return world() / self.name / record_id

    def _pause(self, record: Record, key: str) -> None:
        ms = int(record.spec.get(key, 0))
        if ms:
            time.sleep(ms / 1000)

    def create(self, record: Record) -> dict[str, Any]:
        record_id = str(record.id)
        existing = _objects_in(self._folder(record_id))
        if existing:
            obj = existing[0]
            adopted = True
        else:
            folder = self._folder(record_id)
            folder.mkdir(parents=True, exist_ok=True)
            obj = folder / uuid.uuid4().hex
            obj.write_text(record_id)
            adopted = False
        # The object exists first and then takes create_ms to become ready: a worker killed
        # meanwhile leaves an object behind, which the retried create must adopt.
        self._pause(record, "create_ms")
        gate = record.spec.get("gate")
        if gate:
            gate_wait(str(gate))
        return {"object": obj.name, "adopted": adopted, "value": record.spec.get("value")}

    def observe(self, record: Record) -> Observed | None:
        existing = _objects_in(self._folder(str(record.id)))
        return Observed({"object": existing[0].name}) if existing else None

    def delete(self, record: Record) -> None:
        self._pause(record, "delete_ms")
        self.delete_external(str(record.id))

    def sweep(self) -> Iterable[Marked]:
        base = world() / self.name
        if not base.is_dir():
            return
        for folder in base.iterdir():
            if folder.is_dir() and any(folder.iterdir()):
                yield Marked(external_id=folder.name, record_id=folder.name)

    def delete_external(self, external_id: str) -> None:
        folder = self._folder(external_id)
        for obj in _objects_in(folder):
            obj.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            folder.rmdir()


class FlakyKind(SleepKind):
    name = "test.flaky"
    description = (
        "Like test.sleep, but fails: the first create_failures/delete_failures attempts, "
        "then at create_failure_rate/delete_failure_rate; permanent makes create failures final."
    )
    spec_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            **SleepKind.spec_schema["properties"],
            "create_failures": {"type": "integer", "minimum": 0, "default": 0},
            "delete_failures": {"type": "integer", "minimum": 0, "default": 0},
            "create_failure_rate": {"type": "number", "minimum": 0, "maximum": 1, "default": 0},
            "delete_failure_rate": {"type": "number", "minimum": 0, "maximum": 1, "default": 0},
            "permanent": {"type": "boolean", "default": False},
        },
        "additionalProperties": False,
    }

    def _maybe_fail(self, record: Record, op: str) -> None:
        # ``attempts`` counts this operation's earlier failures (the services keep it).
        if record.attempts < int(record.spec.get(f"{op}_failures", 0)) or random.random() < float(
            record.spec.get(f"{op}_failure_rate", 0)
        ):
            message = f"injected {op} failure (attempt {record.attempts + 1})"
            if op == "create" and record.spec.get("permanent"):
                raise PermanentError(message)
            raise KindError(message)

    def create(self, record: Record) -> dict[str, Any]:
        self._maybe_fail(record, "create")
        return super().create(record)

    def delete(self, record: Record) -> None:
        self._maybe_fail(record, "delete")
        super().delete(record)
