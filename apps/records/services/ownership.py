"""A record's owner and lifetime: TTLs (set, extend, release, expire) and transfer to
another owner."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.core import access
from apps.core.errors import Conflict, ValidationFailed
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from apps.records.services.delete import record_delete_request
from apps.records.services.transitions import (
    Actor,
    _audit,
    _audited,
    _event,
    _event_kwargs,
    _lock_tree,
    _notify,
    _owner_check_alive,
)

# The audit action of a TTL change by its reason; any other (a run keeping a record on its
# stand) is "record.set_expiry".
_EXPIRY_ACTIONS = {"Extended": "record.extend", "Released": "record.release"}


@transaction.atomic
def record_set_expiry(
    *, record: Record, expires_at: datetime | None, actor: Actor = None, reason: str = "TTLChanged"
) -> Record:
    """Set (or with ``None`` release) the record's deadline; expiry deletes its subtree."""
    record = Record.objects.select_for_update(no_key=True).get(pk=record.pk)
    if record.phase == Phase.DELETED or record.deletion_requested_at is not None:
        raise Conflict(f"{record} ({record.pk}) is being deleted; its lifetime can no longer change")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationFailed("the new deadline is in the past", fields={"expires_at": ["must be in the future"]})
    previous = record.expires_at
    before = _audited(record)
    Record.objects.filter(pk=record.pk).update(expires_at=expires_at, updated_at=timezone.now())
    record.expires_at = expires_at
    action = _EXPIRY_ACTIONS.get(reason, "record.set_expiry")
    _audit(action, record, actor=actor, before=before, after=_audited(record), reason=reason)
    Event.objects.create(
        **_event_kwargs(
            record.pk,
            EventType.TTL_CHANGED,
            reason=reason,
            message=f"expires at {expires_at.isoformat()}" if expires_at else "released: no expiry",
            data={
                "from": previous.isoformat() if previous else None,
                "to": expires_at.isoformat() if expires_at else None,
            },
            actor=actor,
        )
    )
    _notify([record])
    return record


def record_extend(*, record: Record, by: timedelta, actor: Actor = None) -> Record:
    """Push the deadline ``by`` further (from now if the record had none)."""
    access.require_actor(actor, "update", "records", record.namespace)
    if by <= timedelta(0):
        raise ValidationFailed("extend by a positive duration", fields={"by": ["must be positive"]})
    start = max(record.expires_at or timezone.now(), timezone.now())
    return record_set_expiry(record=record, expires_at=start + by, actor=actor, reason="Extended")


def record_release(*, record: Record, actor: Actor = None) -> Record:
    """Remove the deadline: the record lives until its owner dies or someone deletes it."""
    access.require_actor(actor, "update", "records", record.namespace)
    return record_set_expiry(record=record, expires_at=None, actor=actor, reason="Released")


def records_expire(*, now: datetime | None = None, limit: int = 500) -> int:
    """Delete the subtrees of records past their deadline (found through a partial index)."""
    now = now or timezone.now()
    due = list(
        Record.objects.filter(expires_at__lte=now, deletion_requested_at__isnull=True)
        .exclude(phase=Phase.DELETED)
        .order_by("expires_at")[:limit]
    )
    for record in due:
        Event.objects.create(
            **_event_kwargs(record.pk, EventType.EXPIRED, reason="Expired", message=f"TTL ended at {record.expires_at}")
        )
        record_delete_request(record=record, reason="Expired")
    return len(due)


class NameTaken(Conflict):
    """The new owner already owns a live record of that kind and name (``holder``)."""

    def __init__(self, detail: str, *, holder: Record) -> None:
        super().__init__(detail)
        self.holder = holder


def record_transfer(
    *,
    record: Record,
    new_owner: Record,
    given_by: Record | None = None,
    expires_at: datetime | None = None,
    replace: bool = False,
    actor: Actor = None,
) -> Record:
    """Give ``record`` and its subtree to ``new_owner`` atomically.

    Ownership is given, never taken: when ``given_by`` is passed (a run handing over what it
    owns) it must be the current owner. Refuses roots, cycles and owners being deleted.
    ``new_owner`` may not own a live record of the same kind and name already (``NameTaken``)
    unless ``replace``: then that one's deletion is requested (children first) in the same
    transaction, and ``record`` takes its place.
    """
    if record.is_root:
        raise ValidationFailed(
            f"{record.kind} records are roots; they cannot be given away", fields={"record": ["is a root"]}
        )
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationFailed("expires_at is in the past", fields={"expires_at": ["must be in the future"]})
    access.require_actor(actor, "update", "records", record.namespace)
    if record.namespace != new_owner.namespace:
        raise ValidationFailed(
            f"{record} is in namespace {record.namespace!r} and {new_owner} in {new_owner.namespace!r}: "
            "an owner is always in its records' namespace",
            fields={"owner": ["in another namespace"]},
        )
    with transaction.atomic():
        while True:
            # The trees' roots in tree order, then the moved row: the order every change to a
            # tree takes its locks in. The tree ids were read before any lock: if a concurrent
            # transfer took either record to another tree meanwhile, give these locks back
            # (the savepoint's rollback releases them) and lock the trees they are in now.
            trees = sorted({record.tree_id, new_owner.tree_id})
            attempt = transaction.savepoint()
            for tree_id in trees:
                _lock_tree(tree_id)
            record = Record.objects.select_for_update(no_key=True).get(pk=record.pk)
            new_owner = Record.objects.get(pk=new_owner.pk)
            if {record.tree_id, new_owner.tree_id} <= set(trees):
                transaction.savepoint_commit(attempt)
                break
            transaction.savepoint_rollback(attempt)
        old_owner_id = record.parent_id
        if given_by is not None and given_by.pk != old_owner_id:
            raise Conflict(
                f"{record} is owned by {old_owner_id}, not {given_by.pk}: ownership is given by the current owner"
            )
        if record.phase == Phase.DELETED or record.deletion_requested_at is not None:
            raise Conflict(f"{record} ({record.pk}) is being deleted; it cannot change owner")
        _owner_check_alive(new_owner)
        if new_owner.pk == record.pk or (
            new_owner.tree_id == record.tree_id and record.lft <= new_owner.lft and new_owner.rght <= record.rght
        ):
            raise ValidationFailed(
                f"cannot give {record} to {new_owner}: a record cannot own its own ancestor",
                fields={"to": ["is the record itself or one of its descendants"]},
            )
        if new_owner.pk == old_owner_id:
            return record
        taken = (
            Record.objects.filter(parent=new_owner, kind=record.kind, name=record.name, deletion_requested_at=None)
            .exclude(phase=Phase.DELETED)
            .first()
        )
        if taken is not None and not replace:
            raise NameTaken(
                f"{new_owner} already owns a live {record.kind} named {record.name!r} ({taken.pk})", holder=taken
            )
        if taken is not None:
            record_delete_request(
                record=taken, actor=actor, reason="Replaced", message=f"replaced by {record} ({record.pk})"
            )
        size = record.descendants_counted() + 1
        before = _audited(record)
        Record.objects.move_node(record, new_owner, position="last-child")
        # mptt placed the subtree at the new owner's old right end, after its free numbers,
        # which are no longer at its right end: it has none now (Record.tree_slack).
        Record.objects.filter(pk=new_owner.pk).update(tree_slack=0)
        now = timezone.now()
        fields: dict[str, Any] = {"updated_at": now}
        if expires_at is not None:
            fields["expires_at"] = expires_at
        Record.objects.filter(pk=record.pk).update(**fields)
        data = {
            "record": str(record.pk),
            "from": str(old_owner_id),
            "to": str(new_owner.pk),
            "subtree_records": size,
            "expires_at": expires_at.isoformat() if expires_at else None,
        }
        Event.objects.bulk_create(
            [
                _event(record.pk, EventType.TRANSFERRED_IN, reason="Transferred", data=data, actor=actor, at=now),
                _event(old_owner_id, EventType.TRANSFERRED_OUT, reason="GaveAway", data=data, actor=actor, at=now),
                _event(new_owner.pk, EventType.TRANSFERRED_IN, reason="Received", data=data, actor=actor, at=now),
            ]
        )
        _notify([record, Record(pk=old_owner_id, namespace=record.namespace), new_owner])
        moved = Record.objects.get(pk=record.pk)
        _audit(
            "record.transfer",
            moved,
            actor=actor,
            before=before,
            after=_audited(moved),
            **{"from": old_owner_id, "to": new_owner.pk, "subtree": size},
        )
    return moved
