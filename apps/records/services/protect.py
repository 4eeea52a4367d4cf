"""Protected records: deletion stops at them.

A protected record whose deletion is requested (itself, an owner's, a TTL's, a run's end) is
*held*: it and everything it owns stay as they are, and the owners between it and the record
whose deletion was requested are *blocked*: they keep their deletion requested and wait, since
children go first. Everything else in the subtree is deleted as usual. Each held protected
record and each blocked owner gets one ``deletion_blocked`` event naming the protected record.
Unprotecting a held record lets its deletion go on from where it stopped: its subtree, then
it, then the blocked owners, children first.

Held and blocked records carry no lease (``next_attempt_at``): there is nothing to retry until
the protection goes, so the reconciler does not chase them; unprotecting gives them one again.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from apps.core import access, audit
from apps.core.errors import Conflict, ValidationFailed
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from apps.records.services.transitions import (
    Actor,
    _audit,
    _audited,
    _blocked,
    _enqueue_deletions_on_commit,
    _event,
    _event_kwargs,
    _held,
    _lease,
    _live_children,
    _lock_tree,
    _notify,
)

# Phases in which a record's own delete is under way: its lease belongs to that delete.
_OWN_DELETE = (Phase.DELETING, Phase.DELETE_FAILED, Phase.DELETED)


def protected_by(actor: Actor) -> str:
    """Who protects, as the audit trail names actors: ``user:alice``, ``run:deploy#4``."""
    who = audit.who_of(actor)
    return f"{who.kind}:{who.name}"[:200]


def record_protect(*, record: Record, actor: Actor = None) -> Record:
    """Protect ``record``: a deletion that reaches it stops there until it is unprotected.

    Refused for a root (protect what a run or stand owns), a deleted record, and one whose
    deletion was requested already (protection keeps a deletion from starting; it does not
    undo one under way). Protecting a protected record changes nothing.
    """
    access.require_actor(actor, "update", "records", record.namespace)
    with transaction.atomic():
        record = Record.objects.select_for_update(no_key=True).get(pk=record.pk)
        if record.protected:
            return record  # its deletion may wait on it already: still nothing to change
        _refuse_protect(record)
        before = _audited(record)
        _set_protected(record, by=protected_by(actor))
        protected_event(record, actor=actor)
        _audit("record.protect", record, actor=actor, before=before, after=_audited(record))
        _notify([record])
    return record


def _refuse_protect(record: Record) -> None:
    if record.is_root:
        raise ValidationFailed(
            f"{record} ({record.pk}) is a {record.kind} root; protect the records it owns",
            fields={"record": ["is a root"]},
        )
    if record.phase == Phase.DELETED:
        raise Conflict(f"{record} ({record.pk}) is deleted; only a live record can be protected")
    if record.deletion_requested_at is not None:
        raise Conflict(
            f"{record} ({record.pk}) is being deleted (requested at {record.deletion_requested_at:%Y-%m-%d %H:%M:%S} "
            "UTC); protection keeps a deletion from starting, it cannot stop one under way"
        )


def _set_protected(record: Record, *, by: str) -> None:
    """Mark the locked ``record`` protected (no event, no audit row: the caller writes them)."""
    now = timezone.now()
    Record.objects.filter(pk=record.pk).update(protected=True, protected_by=by, protected_at=now, updated_at=now)
    record.protected, record.protected_by, record.protected_at = True, by, now


def record_unprotect(*, record: Record, actor: Actor = None) -> Record:
    """Remove ``record``'s protection. If a deletion was waiting on it, that deletion goes on:
    what it owns, then it, then the owners that waited, children first (``_deletion_resume``).
    Unprotecting an unprotected record changes nothing."""
    access.require_actor(actor, "update", "records", record.namespace)
    with transaction.atomic():
        tree_id = Record.objects.filter(pk=record.pk).values_list("tree_id", flat=True).get()
        _lock_tree(tree_id)  # the deletion may go on: the tree's shape is read below
        record = Record.objects.select_for_update(no_key=True).get(pk=record.pk)
        if record.phase == Phase.DELETED:
            raise Conflict(f"{record} ({record.pk}) is deleted; there is no protection to remove")
        if not record.protected:
            return record
        before = _audited(record)
        was_by = record.protected_by
        now = timezone.now()
        Record.objects.filter(pk=record.pk).update(protected=False, protected_by="", protected_at=None, updated_at=now)
        record.protected, record.protected_by, record.protected_at = False, "", None
        waiting = record.deletion_requested_at is not None
        Event.objects.create(
            **_event_kwargs(
                record.pk,
                EventType.UNPROTECTED,
                reason="Unprotected",
                message="unprotected" + ("; its deletion goes on, children first" if waiting else ""),
                data={"was_protected_by": was_by, "deletion_resumed": waiting},
                actor=actor,
                at=now,
            )
        )
        _audit("record.unprotect", record, actor=actor, before=before, after=_audited(record))
        if waiting:
            _deletion_resume(record)
        _notify([record])
    return record


def _deletion_resume(record: Record) -> None:
    """A held record was unprotected: its deletion, and its blocked owners', go on.

    Within its subtree and up its chain of owners whose deletion was requested, each record
    still held or blocked (another protected record) keeps waiting without a lease; the others
    get one (the reconciler's net under the tasks), and the deletable frontier is enqueued.
    """
    now = timezone.now()
    scope = Record.objects.filter(tree_id=record.tree_id, deletion_requested_at__isnull=False).filter(
        Q(lft__gte=record.lft, rght__lte=record.rght) | Q(lft__lt=record.lft, rght__gt=record.rght)
    )
    waiting = scope.exclude(phase__in=_OWN_DELETE)
    waiting.filter(_held() | _blocked()).update(next_attempt_at=None)
    waiting.exclude(_held() | _blocked()).update(next_attempt_at=now + _lease())
    frontier = (
        waiting.filter(lft__gte=record.lft, rght__lte=record.rght)
        .filter(~_live_children())
        .filter(~_held())
        .values_list("pk", "parent_id")
    )
    _enqueue_deletions_on_commit(list(frontier))
    # Protected records further down that still hold: the owners above them, up to the top
    # of this deletion, now wait on them.
    deletion_blocked_tell(tree_id=record.tree_id, lft=record.lft, rght=record.rght)


def deletion_hold(subtree: QuerySet[Record]) -> bool:
    """After a deletion request marked ``subtree``: the rows a protected record holds, and the
    owners blocked by one, wait without a lease. False when the subtree holds no protected
    record (the common case, answered from the small ``record_protected`` index)."""
    if not subtree.filter(protected=True).exists():
        return False
    subtree.exclude(phase__in=_OWN_DELETE).filter(_held() | _blocked()).update(next_attempt_at=None)
    return True


def deletion_blocked_tell(*, tree_id: int, lft: int, rght: int) -> int:
    """One ``deletion_blocked`` event per waiting record and protected record: on each held
    protected record between ``lft`` and ``rght`` of tree ``tree_id``, and on each of its owners
    whose deletion waits on it (up to the top of the deletion, or to a protected owner, which
    holds them itself). A record told already in this protection's time is not told again.
    Returns how many events were written."""
    held = list(
        Record.objects.filter(
            tree_id=tree_id,
            lft__gte=lft,
            rght__lte=rght,
            protected=True,
            deletion_requested_at__isnull=False,
        )
        .exclude(phase=Phase.DELETED)
        .order_by("lft")
    )
    events: list[Event] = []
    notified: list[Record] = []
    for protected in held:
        chain = list(
            Record.objects.filter(
                tree_id=tree_id,
                lft__lt=protected.lft,
                rght__gt=protected.rght,
                deletion_requested_at__isnull=False,
            )
            .exclude(phase=Phase.DELETED)
            .order_by("-lft")  # nearest owner first
            .only("id", "kind", "name", "namespace", "protected")
        )
        waiting: list[Record] = [protected]
        for owner in chain:
            if owner.protected:
                break  # a protected owner holds what is above it in its own right
            waiting.append(owner)
        told = set(
            Event.objects.filter(
                record_id__in=[r.pk for r in waiting],
                type=EventType.DELETION_BLOCKED,
                data__protected=str(protected.pk),
                created_at__gte=protected.protected_at,
            ).values_list("record_id", flat=True)
        )
        what = f"{protected.kind}/{protected.name} ({protected.pk})"
        hint = f"graphenectl unprotect {protected.pk}"
        for record in waiting:
            if record.pk in told:
                continue
            if record.pk == protected.pk:
                message = (
                    f"protected by {protected.protected_by}: it and what it owns stay; "
                    f"its deletion goes on once it is unprotected ({hint})"
                )
            else:
                message = f"waits on the protected {what}, which it owns; unprotect that to finish ({hint})"
            events.append(_blocked_event(record, protected, message))
            notified.append(record)
    Event.objects.bulk_create(events)
    _notify(notified)
    return len(events)


def _blocked_event(record: Record, protected: Record, message: str) -> Event:
    return _event(
        record.pk,
        EventType.DELETION_BLOCKED,
        reason="DeletionBlocked",
        message=message,
        data={"protected": str(protected.pk), "protected_by": protected.protected_by},
    )


def protected_declare(record: Record, *, actor: Actor) -> None:
    """A declaration with ``protect=True`` of the locked, live ``record`` (new or re-declared):
    protect it unless it is already. A declaration only adds protection; removing it is an
    explicit ``record_unprotect``."""
    if record.protected:
        return
    _refuse_protect(record)
    _set_protected(record, by=protected_by(actor))
    protected_event(record, actor=actor, declared=True)


def protected_event(record: Record, *, actor: Actor, declared: bool = False) -> None:
    """Write the ``protected`` event of a record just protected (by a declaration, or by a user)."""
    protected_event_row(record, actor=actor, declared=declared).save(force_insert=True)


def protected_event_row(record: Record, *, actor: Actor, declared: bool = False) -> Event:
    """The ``protected`` event of a record just protected, unsaved (a declaration writes it in
    its own statement)."""
    return _event(
        record.pk,
        EventType.PROTECTED,
        reason="Protected",
        message=f"{'declared ' if declared else ''}protected by {record.protected_by}: "
        "a deletion stops here until it is unprotected",
        data={"by": record.protected_by, **({"declared": True} if declared else {})},
        actor=actor,
        at=record.protected_at,
    )
