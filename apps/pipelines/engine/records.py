"""The runtime's record calls: declare, wait until ready, delete, attach, hand to the stand."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from graphene_sdk import ResourceFailed

from apps.pipelines import services
from apps.pipelines.choices import EntryStatus
from apps.pipelines.engine.journal import _Suspend, is_uuid, result_of
from apps.pipelines.engine.state import ExecutionState
from apps.pipelines.models import Run
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Record

# Phases in which ready() waits; every other phase is settled.
WAITING_PHASES = frozenset({Phase.PENDING, Phase.CREATING, Phase.UPDATING})
READY_PHASES = frozenset({Phase.READY, Phase.DRIFTED})


class RecordCalls(ExecutionState):
    def declare(
        self,
        kind: str,
        name: str,
        spec: Mapping[str, Any],
        labels: Mapping[str, str],
        parent: str | None,
        children: Sequence[str] = (),
        drift: Mapping[str, Any] | None = None,
        protect: bool = False,
    ) -> str:
        call = f"declare {kind}/{name}" + (f" under {parent}" if parent else "")
        if children:
            call += f" owning {','.join(children)}"
        if protect:  # part of the call: a replay that no longer protects it does not match (I5)
            call += " protected"
        entry = self.journal.next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error)
            return str(result_of(entry)["record_id"])

        def do(run: Run) -> str:  # the record and its journal entry commit together (I1)
            owner = self.owner(parent, run)
            owned = [self.owned(child, run) for child in children]
            record = records.record_declare(
                kind=kind,
                name=name,
                owner=owner,
                spec=dict(spec),
                labels=dict(labels),
                drift_policy=(drift or {}).get("on_drift", "heal"),
                observe_every=(drift or {}).get("reconcile_every"),
                protect=protect,
            )
            for child in owned:
                records.record_transfer(record=child, new_owner=record, given_by=child.parent)
            return str(record.pk)

        return self.journal.act(
            self.journal.seq, call, do, lambda pk: {"record_id": pk}, refused=f"cannot declare {kind}/{name}"
        )

    def ready(self, record_id: str, label: str) -> tuple[dict[str, Any] | None, ResourceFailed | None]:
        call = f"ready {label}"
        entry = self.journal.next(call)
        if entry is not None:
            if entry.status == EntryStatus.COMPLETED:
                return dict(result_of(entry)["outputs"]), None
            return None, ResourceFailed(entry.error, record_id=record_id, phase=(entry.result or {}).get("phase", ""))
        record = (
            Record.objects.filter(pk=record_id).only("phase", "outputs", "last_error", "deletion_requested_at").first()
        )
        if record is None:
            error = ResourceFailed(f"{label}: record {record_id} does not exist", record_id=record_id)
        elif record.phase in WAITING_PHASES and record.deletion_requested_at is None:
            raise _Suspend(waiting_on=[record_id])
        elif record.phase in READY_PHASES and record.deletion_requested_at is None:
            self.journal.write(self.journal.seq, call, EntryStatus.COMPLETED, {"outputs": record.outputs})
            return dict(record.outputs), None
        else:
            why = record.last_error or ("it is being deleted" if record.deletion_requested_at else "")
            error = ResourceFailed(
                f"{label} is {record.phase}: {why}".rstrip(": "), record_id=record_id, phase=record.phase
            )
        self.journal.write(self.journal.seq, call, EntryStatus.FAILED, {"phase": error.phase}, str(error))
        return None, error

    def delete(self, record_id: str, label: str) -> None:
        call = f"delete {label}"
        if self.journal.next(call) is not None:
            return
        with transaction.atomic():
            record = Record.objects.filter(pk=record_id).first()
            if record is not None:
                records.record_delete_request(record=record, reason="DeletedByRun")
            self.journal.write(self.journal.seq, call, EntryStatus.COMPLETED, {"record_id": record_id})

    def attach(self, record_id: str) -> tuple[str, str]:
        call = f"attach {record_id}"
        entry = self.journal.next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error, record_id=record_id)
            return str(result_of(entry)["kind"]), str(result_of(entry)["name"])
        record = Record.objects.filter(pk=record_id).only("kind", "name").first() if is_uuid(record_id) else None
        if record is None:
            raise self.journal.refuse(
                self.journal.seq, call, f"cannot attach {record_id}: no such record", record_id=record_id
            )
        self.journal.write(self.journal.seq, call, EntryStatus.COMPLETED, {"kind": record.kind, "name": record.name})
        return record.kind, record.name

    def to_stand(self, record_id: str, label: str, keep_for: float | None, replace: bool = False) -> None:
        call = f"to_stand {label}"
        entry = self.journal.next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error, record_id=record_id)
            return

        def do(run: Run) -> dict[str, Any]:
            until = timezone.now() + timedelta(seconds=keep_for) if keep_for else None
            stand = services.stand_get(run.pipeline.name, namespace=run.namespace)
            record = Record.objects.filter(pk=record_id).first()
            if record is not None and record.parent_id == stand.pk:
                # Already handed over (by this run, before a replay): only the TTL changes.
                records.record_set_expiry(record=record, expires_at=until, reason="KeptOnStand")
            else:
                record = self.owned(record_id, run)
                try:
                    records.record_transfer(
                        record=record, new_owner=stand, given_by=record.parent, expires_at=until, replace=replace
                    )
                except records.NameTaken as taken:
                    raise ResourceFailed(_stand_taken(label, stand, taken.holder)) from None
            return {"record_id": record_id, "stand": str(stand.pk), "expires_at": until.isoformat() if until else None}

        self.journal.act(
            self.journal.seq,
            call,
            do,
            lambda data: data,
            refused=f"cannot hand {label} to the stand",
            record_id=record_id,
        )


def _stand_taken(label: str, stand: Record, holder: Record) -> str:
    """Why a handle cannot go to the stand, and the ways out."""
    since = f", kept since {holder.updated_at:%Y-%m-%d %H:%M} UTC" if holder.updated_at else ""
    return (
        f"the stand {stand.name!r} already holds a {label} ({holder.pk}{since}); "
        f"replace it with ctx.to_stand(handle, replace=True), give this one another name, "
        f"or delete that one first (graphenectl delete {holder.pk})"
    )
