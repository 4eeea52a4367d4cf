"""The execution engine: runs a pipeline function by replaying its journal (I5).

Each SDK call takes the next sequence number. If the journal has an entry there, the call
must be the same (else ``NonDeterminismError``) and returns the recorded result; otherwise
it acts and journals. Journal writes are *fenced*: they succeed only while this worker holds
the run's lease and the run is still running, so a worker that lost its lease (it was too
slow, or the run was cancelled) cannot write anything more and stops at its next call.

``Resource.ready()`` on a record that has not settled, and ``ctx.sleep`` before its time,
*suspend* the run: the worker is released and the run is re-queued when a record it waits
on settles (records call ``runs_wake``) or its timer is due (beat).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from graphene_sdk import (
    ChildRunFailed,
    Context,
    NonDeterminismError,
    OutcomeUnknown,
    RemoteError,
    ResourceFailed,
    StepFailed,
    StepTimeout,
)
from graphene_sdk import Pipeline as Definition
from graphene_sdk._context import Guarantee
from graphene_sdk._remote import RemoteCall
from pydantic import BaseModel

from apps.agents import selectors as agent_selectors
from apps.agents import services as agents
from apps.agents.choices import CommandKind
from apps.agents.models import AgentCommand
from apps.core.errors import GrapheneError as ServiceError
from apps.observability.services import log_write
from apps.observability.tracing import RunTelemetry
from apps.pipelines import services
from apps.pipelines.choices import TERMINAL, EntryStatus, RunStatus
from apps.pipelines.models import JournalEntry, Run
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Record

logger = logging.getLogger(__name__)

# Phases in which ready() waits; every other phase is settled.
WAITING_PHASES = frozenset({Phase.PENDING, Phase.CREATING, Phase.UPDATING})
READY_PHASES = frozenset({Phase.READY, Phase.DRIFTED})


class _Suspend(BaseException):
    """Unwinds the pipeline function to release the worker (not catchable as Exception).

    By default the run resumes when a target in ``waiting_on`` settles. ``until`` replaces
    that test for waits on something more specific than "settled" (an agent record that gave
    up creating stays settled until its agent connects): the run is still woken by the
    targets' transitions, and goes again at once only if ``until()`` already holds.
    """

    def __init__(
        self,
        *,
        waiting_on: list[str] | None = None,
        wake_at: datetime | None = None,
        until: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__("suspend")
        self.waiting_on = waiting_on or []
        self.wake_at = wake_at
        self.until = until


class _Fenced(BaseException):
    """This worker may no longer act for the run (lease lost, run cancelled or ended)."""


class _CommandFailed(Exception):
    """A finished agent command that did not do what was asked (``remote``: what a function raised)."""

    def __init__(self, message: str, *, remote: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.remote = remote


def _command_succeeded(command: AgentCommand, what: str) -> None:
    if command.status != "succeeded":
        raise _CommandFailed(f"{what} failed: {command.error or command.status}")


def _command_error(message: str, info: Mapping[str, Any], record_id: str) -> ResourceFailed | RemoteError:
    """The error a failed command's journal entry stands for, the same on every replay."""
    remote = info.get("remote")
    if isinstance(remote, Mapping):
        return RemoteError(
            message,
            function=str(remote.get("function", "")),
            remote_type=str(remote.get("type", "")),
            remote_message=str(remote.get("message", "")),
            remote_traceback=str(remote.get("traceback", "")),
            record_id=record_id,
        )
    return ResourceFailed(message, record_id=record_id)


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _result(entry: JournalEntry) -> dict[str, Any]:
    result: dict[str, Any] = entry.result or {}
    return result


def _json(value: Any) -> Any:
    """The JSON form replay will return; the first execution returns the same.

    A NUL character is refused here, with the reason: PostgreSQL cannot store it in JSON, and
    a value that cannot be journaled would otherwise keep the run from ever ending.
    """
    value = value.model_dump(mode="json") if isinstance(value, BaseModel) else json.loads(json.dumps(value))
    where = _nul_at(value, "")
    if where is not None:
        raise ValueError(
            f"the value{f' at {where}' if where else ''} contains a NUL character (\\x00), which cannot be "
            "stored; remove it or encode the data (e.g. base64)"
        )
    return value


def _nul_at(value: Any, path: str) -> str | None:
    """The path of the first string (or key) holding a NUL character in a JSON value."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            if "\x00" in key:
                return f"{path}.{key!r}".lstrip(".")
            found = _nul_at(item, f"{path}.{key}".lstrip("."))
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _nul_at(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


class Execution:
    """One attempt at executing a run, holding its lease (the ``Runtime`` of its Context)."""

    def __init__(self, run: Run, token: uuid.UUID, definition: Definition[Any, Any]) -> None:
        self.run = run
        self.run_id = str(run.pk)
        self.token = token
        self.definition = definition
        self.journal = {e.seq: e for e in JournalEntry.objects.filter(run=run)}
        self.seq = 0
        # Agents this run found (attach_agent, select_agents): it may run commands on them
        # without owning them. Filled as those calls run or replay, before any command on them.
        self.attached_agents: set[str] = set()
        self.divergence: NonDeterminismError | None = None
        self.lost = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self.telemetry = RunTelemetry(run)  # spans and step metrics, buffered, written in batches

    # --- journal -----------------------------------------------------------------------------

    def leftover(self) -> JournalEntry | None:
        """The first journaled call the program has not made (it now ends earlier)."""
        later = [seq for seq in self.journal if seq > self.seq]
        return self.journal[min(later)] if later else None

    def _next(self, call: str) -> JournalEntry | None:
        if self.lost.is_set():
            raise _Fenced
        if self.divergence is not None:
            raise self.divergence
        self.seq += 1
        entry = self.journal.get(self.seq)
        if entry is None:
            return None
        if entry.call != call:
            self.divergence = NonDeterminismError(
                f"non-deterministic pipeline: call #{self.seq} is {call!r} but the journal recorded "
                f"{entry.call!r}; the program changed since this run started",
                seq=self.seq,
                journaled=entry.call,
                called=call,
            )
            raise self.divergence
        return entry

    def _fence_sql(self) -> tuple[str, list[Any]]:
        return (
            "EXISTS (SELECT 1 FROM pipelines_run WHERE id = %s AND lease_token = %s AND status = %s)",
            [self._db(self.run.pk), self._db(self.token), RunStatus.RUNNING],
        )

    @staticmethod
    def _db(value: uuid.UUID) -> Any:
        return value if connection.vendor == "postgresql" else value.hex

    def _write(self, seq: int, call: str, status: str, result: Any = None, error: str = "") -> None:
        """Insert or complete the journal entry ``seq`` in one fenced statement."""
        now = timezone.now()
        fence, fence_params = self._fence_sql()
        cast = "::jsonb" if connection.vendor == "postgresql" else ""
        payload = json.dumps(result)
        error = error.replace("\x00", "\\x00")  # PostgreSQL text cannot hold NUL (an exception's message may)
        done = now if status != EntryStatus.STARTED else None
        with connection.cursor() as cursor:
            if seq in self.journal:
                cursor.execute(
                    f"UPDATE pipelines_journalentry SET status = %s, result = %s{cast}, error = %s, completed_at = %s "  # noqa: S608
                    f"WHERE run_id = %s AND seq = %s AND {fence}",
                    [status, payload, error, done, self._db(self.run.pk), seq, *fence_params],
                )
            else:
                cursor.execute(
                    "INSERT INTO pipelines_journalentry "
                    "(run_id, seq, call, status, result, error, created_at, completed_at) "
                    f"SELECT %s, %s, %s, %s, %s{cast}, %s, %s, %s WHERE {fence}",
                    [self._db(self.run.pk), seq, call, status, payload, error, now, done, *fence_params],
                )
            if cursor.rowcount != 1:
                self.lost.set()
                raise _Fenced
        self.journal[seq] = JournalEntry(
            run_id=self.run.pk, seq=seq, call=call, status=status, result=result, error=error, created_at=now
        )

    def _check_fence(self) -> None:
        alive = Run.objects.filter(pk=self.run.pk, lease_token=self.token, status=RunStatus.RUNNING).exists()
        if not alive:
            self.lost.set()
            raise _Fenced

    # --- Runtime: declarations ---------------------------------------------------------------

    def declare(
        self,
        kind: str,
        name: str,
        spec: Mapping[str, Any],
        labels: Mapping[str, str],
        parent: str | None,
        children: Sequence[str] = (),
        drift: Mapping[str, Any] | None = None,
    ) -> str:
        call = f"declare {kind}/{name}" + (f" under {parent}" if parent else "")
        if children:
            call += f" owning {','.join(children)}"
        entry = self._next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error)
            return str(_result(entry)["record_id"])
        failure = ""
        with transaction.atomic():  # the record and its journal entry commit together
            run = Run.objects.select_for_update(no_key=True).get(pk=self.run.pk)
            if run.lease_token != self.token or run.status != RunStatus.RUNNING:
                self.lost.set()
                raise _Fenced
            try:
                owner = self._owner(parent, run)
                owned = [self._owned(child, run) for child in children]
                record = records.record_declare(
                    kind=kind,
                    name=name,
                    owner=owner,
                    spec=dict(spec),
                    labels=dict(labels),
                    drift_policy=(drift or {}).get("on_drift", "heal"),
                    observe_every=(drift or {}).get("reconcile_every"),
                )
                for child in owned:
                    records.record_transfer(record=child, new_owner=record, given_by=child.parent)
            except (ServiceError, ResourceFailed) as exc:
                failure = f"cannot declare {kind}/{name}: {getattr(exc, 'detail', exc)}"
                # Journaled too: the sequence stays dense and replay raises the same error.
                self._write(self.seq, call, EntryStatus.FAILED, None, failure)
            else:
                self._write(self.seq, call, EntryStatus.COMPLETED, {"record_id": str(record.pk)})
        if failure:
            raise ResourceFailed(failure)
        return str(record.pk)

    def _owned(self, record_id: str, run: Run) -> Record:
        """A live record in this run's tree (which the run may give away)."""
        if run.record_id is None:
            raise ResourceFailed("this run has no record tree")
        record = Record.objects.filter(pk=record_id).first()
        root = Record.objects.get(pk=run.record_id)
        if record is None or record.tree_id != root.tree_id or record.pk == root.pk:
            raise ResourceFailed(f"record {record_id} is not owned by this run")
        return record

    def _owner(self, parent: str | None, run: Run) -> Record:
        if run.record_id is None:
            raise ResourceFailed("this run has no record to own declarations")
        if parent is None:
            return Record.objects.get(pk=run.record_id)
        owner = Record.objects.filter(pk=parent).first()
        root = Record.objects.get(pk=run.record_id)
        if owner is None or owner.tree_id != root.tree_id:
            raise ResourceFailed(f"parent {parent} is not a record owned by this run")
        return owner

    def ready(self, record_id: str, label: str) -> tuple[dict[str, Any] | None, ResourceFailed | None]:
        call = f"ready {label}"
        entry = self._next(call)
        if entry is not None:
            if entry.status == EntryStatus.COMPLETED:
                return dict(_result(entry)["outputs"]), None
            return None, ResourceFailed(entry.error, record_id=record_id, phase=(entry.result or {}).get("phase", ""))
        record = (
            Record.objects.filter(pk=record_id).only("phase", "outputs", "last_error", "deletion_requested_at").first()
        )
        if record is None:
            error = ResourceFailed(f"{label}: record {record_id} does not exist", record_id=record_id)
        elif record.phase in WAITING_PHASES and record.deletion_requested_at is None:
            raise _Suspend(waiting_on=[record_id])
        elif record.phase in READY_PHASES and record.deletion_requested_at is None:
            self._write(self.seq, call, EntryStatus.COMPLETED, {"outputs": record.outputs})
            return dict(record.outputs), None
        else:
            why = record.last_error or ("it is being deleted" if record.deletion_requested_at else "")
            error = ResourceFailed(
                f"{label} is {record.phase}: {why}".rstrip(": "), record_id=record_id, phase=record.phase
            )
        self._write(self.seq, call, EntryStatus.FAILED, {"phase": error.phase}, str(error))
        return None, error

    def delete(self, record_id: str, label: str) -> None:
        call = f"delete {label}"
        if self._next(call) is not None:
            return
        with transaction.atomic():
            record = Record.objects.filter(pk=record_id).first()
            if record is not None:
                records.record_delete_request(record=record, reason="DeletedByRun")
            self._write(self.seq, call, EntryStatus.COMPLETED, {"record_id": record_id})

    def attach(self, record_id: str) -> tuple[str, str]:
        call = f"attach {record_id}"
        entry = self._next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error, record_id=record_id)
            return str(_result(entry)["kind"]), str(_result(entry)["name"])
        record = Record.objects.filter(pk=record_id).only("kind", "name").first() if _is_uuid(record_id) else None
        if record is None:
            failure = f"cannot attach {record_id}: no such record"
            self._write(self.seq, call, EntryStatus.FAILED, None, failure)
            raise ResourceFailed(failure, record_id=record_id)
        self._write(self.seq, call, EntryStatus.COMPLETED, {"kind": record.kind, "name": record.name})
        return record.kind, record.name

    def to_stand(self, record_id: str, label: str, keep_for: float | None) -> None:
        call = f"to_stand {label}"
        entry = self._next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error, record_id=record_id)
            return
        failure = ""
        with transaction.atomic():
            run = Run.objects.select_for_update(no_key=True).get(pk=self.run.pk)
            if run.lease_token != self.token or run.status != RunStatus.RUNNING:
                self.lost.set()
                raise _Fenced
            until = timezone.now() + timedelta(seconds=keep_for) if keep_for else None
            try:
                stand = services.stand_get(run.pipeline.name)
                record = Record.objects.filter(pk=record_id).first()
                if record is not None and record.parent_id == stand.pk:
                    # Already handed over (by this run, before a replay): only the TTL changes.
                    records.record_set_expiry(record=record, expires_at=until, reason="KeptOnStand")
                else:
                    record = self._owned(record_id, run)
                    records.record_transfer(record=record, new_owner=stand, given_by=record.parent, expires_at=until)
            except (ServiceError, ResourceFailed) as exc:
                failure = f"cannot hand {label} to the stand: {getattr(exc, 'detail', exc)}"
                self._write(self.seq, call, EntryStatus.FAILED, None, failure)
            else:
                data = {
                    "record_id": record_id,
                    "stand": str(stand.pk),
                    "expires_at": until.isoformat() if until else None,
                }
                self._write(self.seq, call, EntryStatus.COMPLETED, data)
        if failure:
            raise ResourceFailed(failure, record_id=record_id)

    def run_children(
        self, pipeline: Definition[Any, Any], inputs: Sequence[dict[str, Any]], concurrency: int
    ) -> list[Any]:
        call = f"run_all {pipeline.name} x{len(inputs)}"
        entry = self._next(call)
        seq = self.seq
        if entry is None:
            with transaction.atomic():
                run = Run.objects.select_for_update(no_key=True).get(pk=self.run.pk)
                if run.lease_token != self.token or run.status != RunStatus.RUNNING:
                    self.lost.set()
                    raise _Fenced
                children = services.run_start_children(
                    parent=run, pipeline_name=pipeline.name, inputs=list(inputs), concurrency=concurrency, group=seq
                )
                ids = [str(c.pk) for c in children]
                self._write(seq, call, EntryStatus.STARTED, {"children": ids})
        elif entry.status == EntryStatus.COMPLETED:
            return self._children_outcome(pipeline, _result(entry))
        else:
            ids = list(_result(entry)["children"])
        ended = Run.objects.filter(pk__in=ids, status__in=list(TERMINAL)).values_list(
            "pk", "status", "outputs", "error"
        )
        by_id = {str(pk): (status, outputs, error) for pk, status, outputs, error in ended}
        if len(by_id) < len(ids):
            raise _Suspend(waiting_on=[i for i in ids if i not in by_id])
        outcome = {
            "children": ids,
            "outputs": [by_id[i][1] for i in ids],
            "failures": {i: f"{by_id[i][0]}: {by_id[i][2]}".strip() for i in ids if by_id[i][0] != RunStatus.SUCCEEDED},
        }
        self._write(seq, call, EntryStatus.COMPLETED, outcome)
        return self._children_outcome(pipeline, outcome)

    @staticmethod
    def _children_outcome(pipeline: Definition[Any, Any], outcome: dict[str, Any]) -> list[Any]:
        failures: dict[str, str] = outcome.get("failures") or {}
        if failures:
            lines = "; ".join(f"{run_id}: {why.splitlines()[-1] if why else ''}" for run_id, why in failures.items())
            raise ChildRunFailed(
                f"{len(failures)} of {len(outcome['children'])} {pipeline.name} run(s) did not succeed: {lines}",
                failures=failures,
            )
        return list(outcome["outputs"])

    # --- Runtime: artifacts ------------------------------------------------------------------

    def publish_artifact(
        self, name: str, data: bytes | Path, content_type: str | None, keep_for: float | None, labels: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Store the bytes, then declare the record, hand it to the stand and journal the reference.

        The blob is staged (streamed, hashed, size-checked) before the transaction and moved
        into the store inside it, with the record and the journal entry: a replay finds the
        entry and returns its reference without reading ``data`` again. A worker killed after
        the move but before the commit leaves an unreferenced blob for the orphan sweeper; the
        replay stores the same digest again (deduplicated).
        """
        from apps.artifacts import blobs
        from apps.artifacts import services as artifacts

        call = f"publish_artifact {name}"
        entry = self._next(call)
        seq = self.seq
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error)
            return _result(entry)
        failure = ""
        try:
            content = artifacts.content_type_validate(content_type, name=name)
            chunks = blobs.chunks_of_bytes(data) if isinstance(data, bytes) else blobs.chunks_of_path(data)
            staged = blobs.stage(chunks)
        except (ServiceError, OSError) as exc:
            failure = f"cannot publish artifact {name!r}: {getattr(exc, 'detail', exc)}"
            with transaction.atomic():
                self._fenced_run()
                self._write(seq, call, EntryStatus.FAILED, None, failure)
            raise ResourceFailed(failure) from None
        try:
            with transaction.atomic():  # blob, record and journal entry commit together
                run = self._fenced_run()
                try:
                    with transaction.atomic():
                        expires_at = timezone.now() + timedelta(seconds=keep_for) if keep_for else None
                        record = artifacts.artifact_publish_for_run(
                            run_root=self._owner(None, run),
                            run_number=run.number,
                            stand=services.stand_get(run.pipeline.name),
                            name=name,
                            staged=staged,
                            content_type=content,
                            labels=dict(labels),
                            expires_at=expires_at,
                        )
                except (ServiceError, ResourceFailed) as exc:
                    failure = f"cannot publish artifact {name!r}: {getattr(exc, 'detail', exc)}"
                    self._write(seq, call, EntryStatus.FAILED, None, failure)
                else:
                    ref = artifacts.ref_of(record)
                    self._write(seq, call, EntryStatus.COMPLETED, ref)
        finally:
            blobs.discard(staged)  # a no-op once moved into the store
        if failure:
            raise ResourceFailed(failure)
        return ref

    def attach_artifact(self, name_or_id: str, pipeline: str | None) -> dict[str, Any]:
        from apps.artifacts import selectors as artifact_selectors
        from apps.artifacts import services as artifacts

        call = f"attach_artifact {name_or_id}" + (f" of {pipeline}" if pipeline else "")
        entry = self._next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error)
            return _result(entry)
        record = artifact_selectors.artifact_attachable(artifact_id=name_or_id) if _is_uuid(name_or_id) else None
        where = pipeline or self.run.pipeline.name
        if record is None and not _is_uuid(name_or_id):
            record = artifact_selectors.artifact_newest(name=name_or_id, pipeline=where)
        if record is None:
            what = (
                f"artifact {name_or_id}"
                if _is_uuid(name_or_id)
                else f"artifact {name_or_id!r} on the stand of {where!r}"
            )
            failure = f"cannot attach {what}: none is live (never published, deleted or expired)"
            self._write(self.seq, call, EntryStatus.FAILED, None, failure)
            raise ResourceFailed(failure)
        ref = artifacts.ref_of(record)
        self._write(self.seq, call, EntryStatus.COMPLETED, ref)
        return ref

    def read_artifact(self, artifact_id: str) -> bytes:
        from apps.artifacts import services as artifacts

        try:
            return artifacts.artifact_read(record_id=artifact_id)
        except ServiceError as exc:
            raise ResourceFailed(f"cannot read artifact {artifact_id}: {exc.detail}", record_id=artifact_id) from None

    # --- Runtime: agents ---------------------------------------------------------------------

    def agent(self, name: str, labels: Mapping[str, str], needs: list[dict[str, Any]]) -> str:
        call = f"agent {name}"
        entry = self._next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error)
            return str(_result(entry)["record_id"])
        failure = ""
        with transaction.atomic():
            run = self._fenced_run()
            try:
                # The install data holds a bootstrap token: it is never journaled (I7);
                # install_env()/install_script() issue a fresh single-use token when asked.
                record = agents.agent_declare(
                    owner=self._owner(None, run), name=name, labels=dict(labels), needs=needs
                ).record
            except ServiceError as exc:
                failure = f"cannot declare agent {name}: {exc.detail}"
                self._write(self.seq, call, EntryStatus.FAILED, None, failure)
            else:
                self._write(self.seq, call, EntryStatus.COMPLETED, {"record_id": str(record.pk)})
        if failure:
            raise ResourceFailed(failure)
        return str(record.pk)

    def agent_install(self, record_id: str, form: str) -> str:
        record = Record.objects.get(pk=record_id)
        token = agents.agent_bootstrap_issue(record=record)
        if form == "env":
            return agents.agent_env_file(record=record, bootstrap_token=token)
        return agents.agent_install_script(record=record, bootstrap_token=token)

    def _machine(self, record_id: str, run: Run) -> Record:
        """An agent this run owns, or one it attached or selected (commands may run on both)."""
        if record_id in self.attached_agents:
            record = Record.objects.filter(pk=record_id, kind="agent").first()
            if record is None:
                raise ResourceFailed(f"agent {record_id} does not exist any more")
            return record
        return self._owned(record_id, run)

    def attach_agent(self, name_or_id: str, needs: list[dict[str, Any]]) -> dict[str, Any]:
        call = f"attach_agent {name_or_id}"
        entry = self._next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error)
            self.attached_agents.add(str(_result(entry)["record_id"]))
            return _result(entry)
        failure = ""
        try:
            clean = agents.needs_clean(needs)
            found = agent_selectors.agent_find(name_or_id=name_or_id)
            if not found:
                failure = f"cannot attach agent {name_or_id}: no live agent has that name or id"
            elif len(found) > 1:
                ids = ", ".join(str(r.pk) for r in found)
                failure = f"cannot attach agent {name_or_id}: {len(found)} live agents have that name; use an id: {ids}"
            else:
                unmet = agent_selectors.agent_needs_unmet(agent=found[0], needs=clean)
                if unmet:
                    failure = f"cannot attach agent {name_or_id}: it {'; it '.join(unmet)}"
        except ServiceError as exc:
            failure = f"cannot attach agent {name_or_id}: {exc.detail}"
        if failure:
            self._write(self.seq, call, EntryStatus.FAILED, None, failure)
            raise ResourceFailed(failure)
        result = {"record_id": str(found[0].pk), "name": found[0].name}
        self._write(self.seq, call, EntryStatus.COMPLETED, result)
        self.attached_agents.add(result["record_id"])
        return result

    def select_agents(self, labels: Mapping[str, str], needs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        call = "select_agents"
        entry = self._next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error)
            chosen: list[dict[str, Any]] = _result(entry)["agents"]
            self.attached_agents.update(str(a["record_id"]) for a in chosen)
            return chosen
        try:
            clean = agents.needs_clean(needs)
        except ServiceError as exc:
            failure = f"cannot select agents: {exc.detail}"
            self._write(self.seq, call, EntryStatus.FAILED, None, failure)
            raise ResourceFailed(failure) from None
        found = agent_selectors.agents_select(labels=dict(labels), needs=clean)
        chosen = [{"record_id": str(r.pk), "name": r.name} for r in found]
        self._write(self.seq, call, EntryStatus.COMPLETED, {"agents": chosen})
        self.attached_agents.update(a["record_id"] for a in chosen)
        return chosen

    def publish_capability(
        self, record_id: str, label: str, name: str, version: str, labels: Mapping[str, str]
    ) -> None:
        call = f"publish_capability {label} {name}"
        entry = self._next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error, record_id=record_id)
            return
        failure = ""
        with transaction.atomic():  # the capability and its journal entry commit together
            run = self._fenced_run()
            try:
                agents.capability_publish(
                    agent=self._machine(record_id, run),
                    name=name,
                    version=version,
                    labels=dict(labels),
                    published_by=run.record_id,
                )
            except (ServiceError, ResourceFailed) as exc:
                failure = f"cannot publish {name} on {label}: {getattr(exc, 'detail', exc)}"
                self._write(self.seq, call, EntryStatus.FAILED, None, failure)
            else:
                self._write(self.seq, call, EntryStatus.COMPLETED, {"name": name, "version": version})
        if failure:
            raise ResourceFailed(failure, record_id=record_id)

    def agent_via_ssh(self, name: str, labels: Mapping[str, str], target: Mapping[str, Any]) -> str:
        """Declare an agent record, install the agent over SSH, wait until it has connected.

        One journal entry carries the whole call. It is written ``started`` with the record
        (one transaction, I1) before anything touches the machine, and holds only names and
        public data: the target, the key's *secret name*, the host key's fingerprint (I7).
        The install itself is an at-least-once, idempotent operation (``ssh_install``): a
        replay after a crash runs it again and it finds the agent running, so nothing is
        installed twice. Once it has succeeded the entry notes so and the run suspends until
        the record is ready (the agent said hello) or the connect deadline passes. An
        unreachable host is retried on durable timers; a host key mismatch, a refused key or
        a missing secret fail the call at once.
        """
        from apps.agents import ssh_install

        call = f"agent_via_ssh {name}"
        entry = self._next(call)
        seq = self.seq
        label = f"agent/{name}"
        if entry is not None and entry.status == EntryStatus.COMPLETED:
            return str(_result(entry)["record_id"])
        if entry is not None and entry.status == EntryStatus.FAILED:
            raise ResourceFailed(entry.error, record_id=str((entry.result or {}).get("record_id", "")))
        ssh = ssh_install.SSHTarget.from_call(target)
        if entry is None:
            failure = ""
            try:
                described = ssh.describe()
            except ssh_install.SSHInstallError as exc:
                failure = f"cannot install {label} over SSH: {exc.detail}"
            with transaction.atomic():  # the record and its journal entry commit together (I1)
                run = self._fenced_run()
                if not failure:
                    try:
                        record = agents.agent_record_declare(
                            owner=self._owner(None, run), name=name, labels=dict(labels)
                        )
                    except (ServiceError, ResourceFailed) as exc:
                        failure = f"cannot declare {label}: {getattr(exc, 'detail', exc)}"
                if failure:
                    self._write(seq, call, EntryStatus.FAILED, None, failure)
                else:
                    state: dict[str, Any] = {"record_id": str(record.pk), "target": described, "attempts": 0}
                    self._write(seq, call, EntryStatus.STARTED, state)
            if failure:
                raise ResourceFailed(failure)
        state = dict(_result(self.journal[seq]))
        record_id = str(state["record_id"])

        def fail(message: str) -> ResourceFailed:
            self._write(seq, call, EntryStatus.FAILED, {"record_id": record_id}, message)
            return ResourceFailed(message, record_id=record_id)

        def connected_or_gone() -> bool:
            return (
                Record.objects.filter(pk=record_id)
                .filter(Q(phase__in=READY_PHASES) | Q(deletion_requested_at__isnull=False) | Q(phase=Phase.DELETED))
                .exists()
            )

        def current() -> Record:
            record = Record.objects.filter(pk=record_id).first()
            if record is None or record.phase == Phase.DELETED or record.deletion_requested_at is not None:
                raise fail(f"{label} was deleted before its agent connected")
            return record

        record = current()
        if not state.get("installed_at") and record.phase not in READY_PHASES:
            self._check_fence()  # a worker that lost the run must not touch the machine
            try:
                log_to = [self.run.record_id] if self.run.record_id is not None else []
                outcome = ssh_install.agent_ssh_install(record=record, target=ssh, log_to=log_to)
            except ssh_install.SSHInstallError as exc:
                attempts = int(state.get("attempts", 0)) + 1
                if not exc.transient or attempts >= settings.GRAPHENE_AGENT_SSH_ATTEMPTS:
                    tries = f" (after {attempts} attempts)" if exc.transient else ""
                    raise fail(f"cannot install {label} over SSH{tries}: {exc.detail}") from None
                delay = min(
                    settings.GRAPHENE_RETRY_BASE_SECONDS * 2 ** (attempts - 1), settings.GRAPHENE_RETRY_MAX_SECONDS
                )
                state.update(attempts=attempts, last_error=exc.detail)
                self._write(seq, call, EntryStatus.STARTED, state)
                raise _Suspend(wake_at=timezone.now() + timedelta(seconds=delay)) from None
            except ServiceError as exc:  # e.g. the record began deletion while we installed
                raise fail(f"cannot install {label} over SSH: {exc.detail}") from None
            state.update(installed_at=timezone.now().isoformat(), install=outcome.as_dict())
            self._write(seq, call, EntryStatus.STARTED, state)
            record = current()
        if record.phase in READY_PHASES:
            self._write(seq, call, EntryStatus.COMPLETED, {"record_id": record_id, "install": state.get("install")})
            return record_id
        installed_at = parse_datetime(str(state["installed_at"]))
        assert installed_at is not None
        deadline = installed_at + timedelta(seconds=settings.GRAPHENE_AGENT_SSH_CONNECT_TIMEOUT_SECONDS)
        if timezone.now() >= deadline:
            where = (state.get("install") or {}).get("directory") or "~/.graphene-agent"
            raise fail(
                f"{label} was installed over SSH on {ssh.address} but did not connect within "
                f"{settings.GRAPHENE_AGENT_SSH_CONNECT_TIMEOUT_SECONDS}s; see {where}/agent.log on that machine "
                f"(is {settings.GRAPHENE_AGENT_SERVER_URL} reachable from it?)"
            )
        raise _Suspend(waiting_on=[record_id], wake_at=deadline, until=connected_or_gone)

    def agent_exec(
        self,
        record_id: str,
        label: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None,
        timeout: float | None,
        guarantee: Guarantee,
    ) -> dict[str, Any]:
        def payload() -> dict[str, Any]:
            built: dict[str, Any] = {"argv": list(argv), "env": dict(env)}
            if cwd is not None:
                built["cwd"] = cwd
            if timeout is not None:
                built["timeout"] = timeout
            return built

        def outcome(command: AgentCommand) -> dict[str, Any]:
            if command.exit_code is None:  # a non-zero exit is a result; not running at all is not
                raise _CommandFailed(f"{argv[0]} on {label} did not run: {command.status}")
            return {
                "exit_code": command.exit_code,
                "stdout_tail": command.stdout_tail,
                "stderr_tail": command.stderr_tail,
            }

        return self._agent_command(
            call=f"exec {label} {argv[0]}",
            record_id=record_id,
            label=label,
            what=f"{argv[0]} on {label}",
            kind=CommandKind.EXEC,
            payload=payload,
            guarantee=guarantee,
            outcome=outcome,
        )

    def agent_put_file(self, record_id: str, label: str, path: str, data: bytes, mode: int) -> dict[str, Any]:
        """The content travels in the command row (until delivered), never in the journal:
        the entry keeps the command's id and the size and SHA-256 the machine reported."""

        def outcome(command: AgentCommand) -> dict[str, Any]:
            _command_succeeded(command, f"put_file {path} on {label}")
            return {"size": command.result.get("size"), "sha256": command.result.get("sha256")}

        return self._agent_command(
            call=f"put_file {label} {path}",
            record_id=record_id,
            label=label,
            what=f"put_file {path} on {label}",
            kind=CommandKind.PUT_FILE,
            payload=lambda: {"path": path, "data": base64.b64encode(data).decode(), "mode": mode},
            guarantee="at_least_once",  # an atomic replace with the same content: repeating it is harmless
            outcome=outcome,
        )

    def agent_get_file(self, record_id: str, label: str, path: str, max_bytes: int) -> bytes:
        """The journal keeps the command's id, size and SHA-256; the content stays in the
        command's result, where a replay reads it again (and checks it against the digest)."""
        what = f"get_file {path} on {label}"

        def outcome(command: AgentCommand) -> dict[str, Any]:
            _command_succeeded(command, what)
            return {"size": command.result.get("size"), "sha256": command.result.get("sha256")}

        payload = {"path": path, "max_bytes": max_bytes}
        result = self._agent_command(
            call=f"get_file {label} {path}",
            record_id=record_id,
            label=label,
            what=what,
            kind=CommandKind.GET_FILE,
            payload=lambda: payload,
            guarantee="at_least_once",
            outcome=outcome,
        )
        command = AgentCommand.objects.filter(pk=result["command"]).only("result").first()
        encoded = (command.result if command is not None else {}).get("data")
        data = base64.b64decode(encoded) if isinstance(encoded, str) else None
        if data is None or hashlib.sha256(data).hexdigest() != result["sha256"]:
            raise ResourceFailed(
                f"{what}: the content read by command {result['command']} is no longer stored", record_id=record_id
            )
        return data

    def agent_call(
        self, record_id: str, label: str, call: RemoteCall, timeout: float | None, guarantee: Guarantee
    ) -> Any:
        """The journal keeps the function's JSON value (or what it raised there), like a step's."""
        what = f"{call.name}() on {label}"

        def outcome(command: AgentCommand) -> dict[str, Any]:
            result = command.result or {}
            if command.status == "succeeded" and "value" in result:
                return {"value": result["value"]}
            if command.status == "failed" and "error_type" in result:
                remote = {
                    "function": call.name,
                    "type": str(result["error_type"]),
                    "message": str(result.get("error_message", "")),
                    "traceback": str(result.get("traceback", "")),
                }
                raise _CommandFailed(f"{what} raised {remote['type']}: {remote['message']}", remote=remote)
            raise _CommandFailed(f"{what} did not return: {command.error or command.status}")

        payload: dict[str, Any] = {"name": call.name, "source": call.source, "args": call.args, "kwargs": call.kwargs}
        if timeout is not None:
            payload["timeout"] = timeout
        result = self._agent_command(
            call=f"call {label} {call.name}",
            record_id=record_id,
            label=label,
            what=what,
            kind=CommandKind.CALL,
            payload=lambda: payload,
            guarantee=guarantee,
            outcome=outcome,
        )
        return result["value"]

    def _agent_command(
        self,
        *,
        call: str,
        record_id: str,
        label: str,
        what: str,
        kind: str,
        payload: Callable[[], dict[str, Any]],
        guarantee: Guarantee,
        outcome: Callable[[AgentCommand], dict[str, Any]],
    ) -> dict[str, Any]:
        """One command on an agent's machine as one journaled call (every command kind).

        The command row and the journal entry (``started``, holding the command's id) commit
        in one transaction; the run suspends until the command has finished; ``outcome`` turns
        the finished row into the journaled result (or raises ``_CommandFailed``). A replay
        returns what the journal holds, or waits on the same command: nothing is sent twice.
        An at-most-once command whose agent vanished is ``OutcomeUnknown``; a command that
        failed is ``ResourceFailed`` (``RemoteError`` for a function that raised there).
        """
        entry = self._next(call)
        seq = self.seq
        if entry is not None and entry.status == EntryStatus.COMPLETED:
            return _result(entry)
        if entry is not None and entry.status == EntryStatus.UNKNOWN:
            raise OutcomeUnknown(entry.error, step=call)
        if entry is not None and entry.status == EntryStatus.FAILED:
            raise _command_error(entry.error, entry.result or {}, record_id)
        if entry is None:
            failure = ""
            with transaction.atomic():  # the command row and its journal entry commit together
                run = self._fenced_run()
                try:
                    command = agents.command_submit(
                        agent=self._machine(record_id, run),
                        kind=kind,
                        payload=payload(),
                        guarantee=guarantee,
                        log_to=[run.record_id],
                    )
                except (ServiceError, ResourceFailed) as exc:
                    failure = f"cannot run {what}: {getattr(exc, 'detail', exc)}"
                    self._write(seq, call, EntryStatus.FAILED, None, failure)
                else:
                    self._write(seq, call, EntryStatus.STARTED, {"command": str(command.pk)})
            if failure:
                raise ResourceFailed(failure, record_id=record_id)
            command_id = str(command.pk)
        else:
            command_id = str(_result(entry)["command"])
        command = agent_selectors.command_get(command_id=command_id, with_payload=False)
        if not command.is_finished:
            raise _Suspend(waiting_on=[command_id])
        if command.status == "unknown":
            message = f"{what} (at most once) was interrupted; it may or may not have run"
            self._write(seq, call, EntryStatus.UNKNOWN, {"command": command_id}, message)
            raise OutcomeUnknown(message, step=call)
        try:
            result = {"command": command_id, **outcome(command)}
        except _CommandFailed as failed:
            info: dict[str, Any] = {"command": command_id}
            if failed.remote is not None:
                info["remote"] = failed.remote
            self._write(seq, call, EntryStatus.FAILED, info, failed.message)
            raise _command_error(failed.message, info, record_id) from None
        self._write(seq, call, EntryStatus.COMPLETED, result)
        return result

    def _fenced_run(self) -> Run:
        run = Run.objects.select_for_update(no_key=True).get(pk=self.run.pk)
        if run.lease_token != self.token or run.status != RunStatus.RUNNING:
            self.lost.set()
            raise _Fenced
        return run

    # --- Runtime: steps, timers, logs -------------------------------------------------------

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
        call = f"step {name}"
        entry = self._next(call)
        seq = self.seq
        if entry is not None:
            if entry.status == EntryStatus.COMPLETED:
                return _result(entry)["value"]
            if entry.status == EntryStatus.FAILED:
                info = entry.result or {}
                cls = StepTimeout if info.get("timeout") else StepFailed
                raise cls(entry.error, step=name, error_type=info.get("type", "Exception"))
            # STARTED (interrupted) or UNKNOWN: never run an at-most-once step twice.
            message = f"step {name!r} (at most once) was interrupted; it may or may not have taken effect"
            if entry.status == EntryStatus.STARTED:
                self._write(seq, call, EntryStatus.UNKNOWN, None, message)
            raise OutcomeUnknown(message, step=name)
        if guarantee == "at_most_once":
            self._write(seq, call, EntryStatus.STARTED)
        started_at = timezone.now()
        attempt = 0
        while True:
            attempt += 1
            try:
                value = _json(self._call(fn, args, kwargs, timeout, name))
                break
            except (TypeError, ValueError) as exc:
                if "JSON" in str(exc) or "serializable" in str(exc):
                    error: BaseException = TypeError(f"step {name!r} returned a value that cannot be journaled: {exc}")
                else:
                    error = exc
            except StepTimeout as exc:
                error = exc
            except Exception as exc:
                error = exc
            if attempt > retries:
                is_timeout = isinstance(error, StepTimeout)
                text = str(error) if is_timeout else f"step {name!r} failed: {type(error).__name__}: {error}"
                self._write(seq, call, EntryStatus.FAILED, {"type": type(error).__name__, "timeout": is_timeout}, text)
                self.telemetry.step(name, seq, started_at, attempts=attempt, guarantee=guarantee, error=text)  # obs.
                cls = StepTimeout if is_timeout else StepFailed
                raise cls(text, step=name, error_type=type(error).__name__) from error
            self._pause(min(settings.GRAPHENE_RETRY_BASE_SECONDS * 2 ** (attempt - 1), 30.0))
        self._write(seq, call, EntryStatus.COMPLETED, {"value": value})
        self.telemetry.step(name, seq, started_at, attempts=attempt, guarantee=guarantee)  # observability
        return value

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"step-{self.run_id[:8]}")
        return self._pool

    def _abandon(self) -> None:
        """Leave a step thread that will not stop (timeout, cancel) and use a fresh one."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def _call(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None, name: str
    ) -> Any:
        """Run a step in a thread so that a cancel or a timeout does not wait for it."""
        future = self._executor().submit(fn, *args, **kwargs)
        started = time.monotonic()
        while True:
            wait = 0.5 if timeout is None else min(0.5, max(0.0, timeout - (time.monotonic() - started)))
            try:
                return future.result(timeout=wait)
            except FutureTimeout:
                pass
            if timeout is not None and time.monotonic() - started >= timeout:
                self._abandon()
                raise StepTimeout(f"step {name!r} timed out after {timeout:g}s", step=name, error_type="StepTimeout")
            try:
                self._check_fence()
            except _Fenced:
                self._abandon()
                raise

    def _pause(self, seconds: float) -> None:
        if self.lost.wait(seconds):
            raise _Fenced

    def sleep(self, seconds: float) -> None:
        entry = self._next("sleep")
        if entry is not None:
            wake_at = parse_datetime(_result(entry)["wake_at"])
            assert wake_at is not None
        else:
            wake_at = timezone.now() + timedelta(seconds=seconds)
            self._write(self.seq, "sleep", EntryStatus.COMPLETED, {"wake_at": wake_at.isoformat(), "seconds": seconds})
        if timezone.now() < wake_at:
            raise _Suspend(wake_at=wake_at)

    def log(self, message: str, level: str) -> None:
        """A journaled call like the others: the line and its entry commit together (fenced),
        so a replay after a crash or a takeover never writes it a second time."""
        if self._next("log") is not None:
            return
        with transaction.atomic():
            if self.run.record_id is not None:
                log_write(record_id=self.run.record_id, message=message, severity=level, source="run")
            self._write(self.seq, "log", EntryStatus.COMPLETED)

    # --- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        self._abandon()


class _Heartbeat(threading.Thread):
    """Extends the run's lease while the function executes; flags the execution if it lost it."""

    def __init__(self, execution: Execution) -> None:
        super().__init__(name=f"lease-{execution.run_id[:8]}", daemon=True)
        self.execution = execution
        self.stopped = threading.Event()

    def run(self) -> None:
        lease = settings.GRAPHENE_RUN_LEASE_SECONDS
        try:
            while not self.stopped.wait(lease / 3):
                self.execution.telemetry.flush()  # observability: long executions write as they go
                extended = Run.objects.filter(
                    pk=self.execution.run.pk, lease_token=self.execution.token, status=RunStatus.RUNNING
                ).update(lease_expires_at=timezone.now() + timedelta(seconds=lease))
                if not extended:
                    self.execution.lost.set()
                    return
        finally:
            connection.close()


def _output(definition: Definition[Any, Any], value: Any) -> Any:
    if value is None:
        return None
    if definition.output is not None and not isinstance(value, definition.output):
        raise TypeError(
            f"{definition.name} must return {definition.output.__name__} or None, not {type(value).__name__}"
        )
    return _json(value)


def run_execute(*, run_id: Any) -> None:
    """Execute (replay) a run until it ends or suspends. The Celery task's body."""
    close_old_connections()
    acquired = services.run_lease_acquire(run_id=run_id)
    if acquired is None:
        return
    run, token = acquired
    try:
        definition = services.definition_get(run.pipeline.name)
        inputs = definition.inputs.model_validate(run.inputs)
    except Exception as exc:
        services.run_finish(run=run, status=RunStatus.FAILED, error=f"cannot load the pipeline: {exc}", token=token)
        return
    execution = Execution(run, token, definition)
    heartbeat = _Heartbeat(execution)
    heartbeat.start()
    try:
        try:
            value = definition.fn(Context(execution), inputs)
            if execution.divergence is not None:
                raise execution.divergence
            extra = execution.leftover()
            if extra is not None:
                raise NonDeterminismError(
                    f"non-deterministic pipeline: the program ended after {execution.seq} calls but the journal "
                    f"recorded call #{extra.seq} {extra.call!r}",
                    seq=extra.seq,
                    journaled=extra.call,
                    called="(end of program)",
                )
            outputs = _output(definition, value)
        except _Suspend as suspend:
            execution.telemetry.end("suspended")  # observability: written before the run's status changes
            services.run_suspend(
                run_id=run.pk,
                token=token,
                waiting_on=suspend.waiting_on,
                wake_at=suspend.wake_at,
                until=suspend.until,
            )
            return
        except _Fenced:
            execution.telemetry.end("fenced")  # observability
            logger.info("run %s: lease lost or run ended; this worker stops", run_id)
            return
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            error = exc if execution.divergence is None else execution.divergence
            text = "".join(traceback.format_exception_only(type(error), error)).strip()
            if not isinstance(
                error, NonDeterminismError | OutcomeUnknown | StepFailed | ResourceFailed | ChildRunFailed | RemoteError
            ):
                text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            elif isinstance(error, RemoteError) and error.remote_traceback:
                text = f"{text}\n\nOn the machine:\n{error.remote_traceback}"  # the traceback that matters
            execution.telemetry.end("failed", text.strip().splitlines()[-1])  # observability
            services.run_finish(
                run=run, status=RunStatus.FAILED, error=text, token=token, keep_for=definition.keep_on_failure
            )
            return
        execution.telemetry.end("succeeded")  # observability
        services.run_finish(run=run, status=RunStatus.SUCCEEDED, outputs=outputs, token=token)
    finally:
        execution.telemetry.end("aborted")  # observability: a no-op unless an exit above was missed
        heartbeat.stopped.set()
        execution.close()
