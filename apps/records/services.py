"""Every write to records: declaration, phase transitions, convergence, cascade deletion,
TTL, transfer, purge and the orphan sweep.

Rules kept here (see DESIGN.md, invariants I1-I4, I6):

* A record row is committed in phase ``pending`` before its kind touches the outside; its
  convergence is enqueued on commit (I1).
* Every phase change goes through ``_transition``, which checks ``TRANSITIONS`` and writes a
  ``phase_changed`` event in the same transaction.
* Tree shape (mptt ``lft``/``rght``) changes only with the tree's root row locked, and record
  rows are only ever written with ``QuerySet.update`` (a model ``save()`` would write back
  stale tree columns).
* Deletion of a subtree goes children first: the deletable frontier (live records with no
  live children) is deleted in batches of siblings; finishing a batch enqueues the parents
  that have become childless. Independent branches proceed in parallel on all workers.
* A failed delete is retried with exponential backoff forever; the record stays visible in
  ``delete_failed`` with an ``error`` event per failure (I6).
* Create and delete of one record never overlap: both hold the record's operation lock
  (a PostgreSQL advisory lock), so a delete waits for an in-flight create and then removes
  what it made.
"""

from __future__ import annotations

import copy
import logging
import random
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import jsonschema
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from apps.core import domain
from apps.core.db import advisory_lock, advisory_xact_lock, closes_connections, lock_key
from apps.core.errors import Conflict, GrapheneError, ValidationFailed
from apps.core.events import publish_on_commit
from apps.records.choices import ROOT_KINDS, TRANSITIONS, DriftPolicy, EventType, Phase
from apps.records.models import Event, Record
from kinds import Drift, Kind, KindError, NotYet, Observed, PermanentError, UnknownKind, get_kind, registry

logger = logging.getLogger(__name__)

Actor = AbstractBaseUser | AnonymousUser | None

# Phases in which a create may be running, so a delete must wait for the operation lock.
_CREATE_IN_FLIGHT = frozenset({Phase.PENDING, Phase.CREATING, Phase.UPDATING})
# Phases that convergence works on.
_CONVERGIBLE = frozenset({Phase.PENDING, Phase.CREATING, Phase.UPDATING})


class IllegalTransition(GrapheneError):
    code = "illegal_transition"


# --- helpers ----------------------------------------------------------------------------------


def _actor_id(actor: Actor) -> Any:
    return actor.pk if actor is not None and actor.is_authenticated else None


def _lease() -> timedelta:
    return timedelta(seconds=settings.GRAPHENE_OPERATION_LEASE_SECONDS)


def backoff_seconds(attempt: int) -> float:
    """Exponential backoff with 10 % jitter: base, 2·base, 4·base … capped."""
    base = settings.GRAPHENE_RETRY_BASE_SECONDS * (2 ** max(attempt - 1, 0))
    delay: float = min(base, settings.GRAPHENE_RETRY_MAX_SECONDS)
    return delay * random.uniform(0.9, 1.1)  # noqa: S311 - jitter, not crypto


def _event(
    record_id: Any,
    type: str,
    *,
    reason: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
    actor: Actor = None,
    at: datetime | None = None,
) -> Event:
    return Event(
        record_id=record_id,
        type=type,
        reason=reason,
        message=message,
        data=data or {},
        actor_id=_actor_id(actor),
        created_at=at or timezone.now(),
    )


def _notify(ids: Iterable[Any]) -> None:
    """Tell watchers (Studio, CLI) which records changed; they re-fetch over REST."""
    id_list = [str(i) for i in ids]
    if id_list:
        publish_on_commit("records", {"event": "records.changed", "ids": id_list})


def _lock_tree(tree_id: int) -> None:
    """Serialize changes to one tree's shape by locking its root row."""
    list(
        Record.objects.select_for_update(no_key=True)
        .filter(tree_id=tree_id, parent__isnull=True)
        .values_list("pk", flat=True)
    )


def _lock_rows(ids: Iterable[Any]) -> None:
    """Lock rows in a consistent order (by primary key) so concurrent batches cannot deadlock."""
    list(Record.objects.select_for_update(no_key=True).filter(pk__in=list(ids)).order_by("pk").values_list("pk"))


def _transition(
    records: Sequence[Record],
    to: str,
    *,
    reason: str,
    message: str = "",
    data: dict[str, Any] | None = None,
    actor: Actor = None,
    fields: dict[str, Any] | None = None,
) -> None:
    """Move locked ``records`` to phase ``to``; one event each, same transaction.

    The caller holds the rows' locks inside ``transaction.atomic``.
    """
    if not records:
        return
    now = timezone.now()
    events = []
    for record in records:
        if to not in TRANSITIONS[record.phase]:
            raise IllegalTransition(f"{record} cannot go from {record.phase} to {to}")
        events.append(
            _event(
                record.pk,
                EventType.PHASE_CHANGED,
                reason=reason,
                message=message,
                data={"from": record.phase, "to": to, **(data or {})},
                actor=actor,
                at=now,
            )
        )
        record.phase = to
        for name, value in (fields or {}).items():
            setattr(record, name, value)
    Record.objects.filter(pk__in=[r.pk for r in records]).update(phase=to, updated_at=now, **(fields or {}))
    Event.objects.bulk_create(events)
    _notify(r.pk for r in records)
    if to in _SETTLING:
        domain.emit(domain.RecordsSettled(record_ids=tuple(str(r.pk) for r in records)))


def record_transition(
    records: Sequence[Record],
    to: str,
    *,
    reason: str,
    message: str = "",
    data: dict[str, Any] | None = None,
    actor: Actor = None,
    fields: dict[str, Any] | None = None,
) -> None:
    """For other apps whose records change phase on their own events (an agent connecting):
    the same checked transition and event. Hold the rows' locks inside ``transaction.atomic``."""
    _transition(records, to, reason=reason, message=message, data=data, actor=actor, fields=fields)


def record_event_write(
    record_id: Any,
    type: str,
    *,
    reason: str,
    message: str = "",
    data: dict[str, Any] | None = None,
    actor: Actor = None,
) -> Event:
    """Append an event to a record's history (not a phase change: those go through transitions)
    and tell its watchers."""
    event = Event.objects.create(
        **_event_kwargs(record_id, type, reason=reason, message=message, data=data or {}, actor=actor)
    )
    _notify([record_id])
    return event


# Whatever waits on a record (a run's ``Resource.ready()``) is told when it reaches one of
# these (``RecordsSettled``); DELETED and DELETE_FAILED always follow DELETING, which told it.
_SETTLING = frozenset({Phase.READY, Phase.CREATE_FAILED, Phase.DRIFTED, Phase.DELETING})


@contextmanager
def operation_lock(record_id: Any) -> Iterator[None]:
    """Hold the record's operation lock: create and delete of one record never overlap.

    PostgreSQL: a session advisory lock, released if the worker dies (its connection closes).
    SQLite (embedded, one process): a process-local lock (``apps.core.db.advisory_lock``).
    """
    with advisory_lock(lock_key(str(record_id))):
        yield


# --- validation -------------------------------------------------------------------------------


def kind_resolve(name: str) -> Kind:
    try:
        return get_kind(name)
    except UnknownKind as exc:
        raise ValidationFailed(str(exc), fields={"kind": [str(exc)]}) from None


def spec_validate(kind: Kind, spec: Any) -> dict[str, Any]:
    """Check ``spec`` against the kind's JSON Schema; all violations, by field path."""
    if not isinstance(spec, dict):
        raise ValidationFailed("spec must be a JSON object", fields={"spec": ["must be a JSON object"]})
    validator = jsonschema.Draft202012Validator(kind.spec_schema)
    errors: dict[str, list[str]] = defaultdict(list)
    for error in sorted(validator.iter_errors(spec), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in ["spec", *error.absolute_path])
        errors[path].append(error.message)
    if errors:
        summary = "; ".join(f"{k}: {', '.join(v)}" for k, v in errors.items())
        raise ValidationFailed(f"spec does not match kind {kind.name}: {summary}", fields=dict(errors))
    return spec


def labels_validate(labels: Any) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise ValidationFailed("labels must map strings to strings", fields={"labels": ["must map strings to strings"]})
    bad = [k for k in labels if not k or len(k) > 63 or "=" in k or "," in k]
    if bad:
        raise ValidationFailed(
            f"invalid label keys {bad}: 1-63 characters, no '=' or ','", fields={"labels": [f"invalid keys {bad}"]}
        )
    return labels


# --- creation ---------------------------------------------------------------------------------


@transaction.atomic
def record_create_root(
    *,
    kind: str,
    name: str,
    spec: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    namespace: str = "default",
    actor: Actor = None,
    phase: str = Phase.READY,
) -> Record:
    """Create a root (a run, a stand or the sweeper): the top of a new, separate tree."""
    if kind not in ROOT_KINDS:
        raise ValidationFailed(f"{kind} is not a root kind", fields={"kind": [f"roots are {sorted(ROOT_KINDS)}"]})
    # mptt numbers a new tree max(tree_id)+1: serialize root creation so two roots never
    # share a tree. The lock is held to the end of this short transaction.
    advisory_xact_lock(0x6772617068656E65)  # "graphene"
    if (
        kind != "graphene.run"
        and Record.objects.filter(kind=kind, namespace=namespace, name=name, parent__isnull=True)
        .exclude(phase=Phase.DELETED)
        .exists()
    ):
        raise Conflict(f"a live {kind} named {name!r} already exists")
    record = Record(
        kind=kind,
        name=name,
        namespace=namespace,
        spec=spec or {},
        labels=labels_validate(labels),
        phase=phase,
        observed_generation=1,
    )
    record.save(force_insert=True)  # a new root: mptt gives it the next tree id
    Event.objects.create(**_event_kwargs(record.pk, EventType.DECLARED, reason="Created", actor=actor))
    _notify([record.pk])
    return record


def record_ensure_root(*, kind: str, name: str, namespace: str = "default") -> Record:
    """The live root of that kind and name, created if missing (stands, the sweeper)."""
    existing = (
        Record.objects.filter(kind=kind, namespace=namespace, name=name, parent__isnull=True)
        .exclude(phase=Phase.DELETED)
        .first()
    )
    if existing is not None:
        return existing
    try:
        return record_create_root(kind=kind, name=name, namespace=namespace)
    except Conflict:
        return (
            Record.objects.filter(kind=kind, namespace=namespace, name=name, parent__isnull=True)
            .exclude(phase=Phase.DELETED)
            .get()
        )


def _event_kwargs(record_id: Any, type: str, **kwargs: Any) -> dict[str, Any]:
    event = _event(record_id, type, **kwargs)
    return {f.attname: getattr(event, f.attname) for f in Event._meta.concrete_fields if f.attname != "id"}


def _owner_check_alive(owner: Record) -> None:
    if owner.phase == Phase.DELETED or owner.deletion_requested_at is not None:
        raise Conflict(f"owner {owner} ({owner.pk}) is being deleted; it cannot own new records")


def record_declare(
    *,
    kind: str,
    name: str,
    owner: Record,
    spec: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    expires_at: datetime | None = None,
    drift_policy: str = DriftPolicy.HEAL,
    observe_every: float | None = None,
    actor: Actor = None,
) -> Record:
    """Declare a record under ``owner``: committed in ``pending``, convergence enqueued on commit.

    Re-declaring the same (owner, kind, name) with the same spec returns the existing record;
    with a different spec it becomes the next generation and re-converges. ``drift_policy``
    (heal or report) and ``observe_every`` (seconds; default: the kind's drift interval) say
    how the drift scheduler treats it once ready.
    """
    kind_obj = kind_resolve(kind)
    if kind in ROOT_KINDS:
        raise ValidationFailed(f"{kind} records are roots and cannot be owned", fields={"kind": ["is a root kind"]})
    if not name or len(name) > 253:
        raise ValidationFailed("name must be 1-253 characters", fields={"name": ["must be 1-253 characters"]})
    spec = spec_validate(kind_obj, {} if spec is None else spec)
    labels = labels_validate(labels)
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationFailed("expires_at is in the past", fields={"expires_at": ["must be in the future"]})
    drift = drift_options_validate(drift_policy, observe_every)
    with transaction.atomic():
        _lock_tree(owner.tree_id)
        owner = Record.objects.get(pk=owner.pk)  # fresh tree columns, under the lock
        _owner_check_alive(owner)
        existing = Record.objects.filter(parent=owner, kind=kind, name=name).exclude(phase=Phase.DELETED).first()
        if existing is not None:
            return _redeclare(existing, spec=spec, labels=labels, drift=drift, actor=actor)
        now = timezone.now()
        record = Record(
            kind=kind,
            name=name,
            namespace=owner.namespace,
            spec=spec,
            labels=labels,
            parent=owner,
            created_by_run_id=owner.pk if owner.kind == "graphene.run" else owner.created_by_run_id,
            expires_at=expires_at,
            phase=Phase.PENDING,
            next_attempt_at=now + _lease(),
            **drift,
        )
        record.save(force_insert=True)  # mptt places it as the owner's last child
        Event.objects.create(
            **_event_kwargs(
                record.pk,
                EventType.DECLARED,
                reason="Declared",
                data={"owner": str(owner.pk), "generation": 1},
                actor=actor,
                at=now,
            )
        )
        _notify([record.pk])
        _enqueue_converge_on_commit(record.pk)
    return record


def drift_options_validate(drift_policy: str, observe_every: float | None) -> dict[str, Any]:
    """The record fields for a declaration's drift options, or a field error."""
    if drift_policy not in DriftPolicy.values:
        raise ValidationFailed(
            f"on_drift must be one of {DriftPolicy.values}, not {drift_policy!r}",
            fields={"on_drift": [f"must be one of {DriftPolicy.values}"]},
        )
    if observe_every is not None and not 1 <= observe_every <= 7 * 86400:
        raise ValidationFailed(
            f"reconcile_every must be between 1 second and 7 days, not {observe_every!r} s",
            fields={"reconcile_every": ["must be between 1 and 604800 seconds"]},
        )
    return {"drift_policy": drift_policy, "observe_every": round(observe_every) if observe_every else None}


def _redeclare(
    existing: Record, *, spec: dict[str, Any], labels: dict[str, str], drift: dict[str, Any], actor: Actor
) -> Record:
    if any(getattr(existing, key) != value for key, value in drift.items()):
        Record.objects.filter(pk=existing.pk).update(**drift)
        for key, value in drift.items():
            setattr(existing, key, value)
    if existing.spec == spec and existing.labels == labels:
        return existing
    record = Record.objects.select_for_update(no_key=True).get(pk=existing.pk)
    if record.deletion_requested_at is not None:
        raise Conflict(f"{record} ({record.pk}) is being deleted; wait for it to finish before re-declaring it")
    generation = record.generation + 1
    fields = {"spec": spec, "labels": labels, "generation": generation, "next_attempt_at": timezone.now() + _lease()}
    data: dict[str, Any] = {"generation": generation}
    moved_from = _moved_from(record, spec)
    if moved_from != record.moved_from:
        fields["moved_from"] = moved_from
        if moved_from is not None:
            data["moving_from"] = _place(record.kind, moved_from["spec"])
    if record.phase in (Phase.READY, Phase.DRIFTED):
        _transition([record], Phase.UPDATING, reason="SpecChanged", data=data, actor=actor, fields=fields)
    elif record.phase == Phase.CREATE_FAILED:
        _transition([record], Phase.CREATING, reason="SpecChanged", data=data, actor=actor, fields=fields)
    else:
        Record.objects.filter(pk=record.pk).update(**fields)
        for key, value in fields.items():
            setattr(record, key, value)
    _enqueue_converge_on_commit(record.pk)
    return record


def _place(kind: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Where a spec puts the object (its kind's ``placement`` fields)."""
    try:
        placement = get_kind(kind).placement
    except UnknownKind:
        placement = ()
    return {field: spec.get(field) for field in placement}


def _moved_from(record: Record, spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """What ``moved_from`` becomes when ``record`` is re-declared with ``spec``: the old spec
    and when the move began (the removal's deadline on a lost machine counts from then)."""
    new = _place(record.kind, spec)
    if not new:
        return None
    if record.moved_from is not None:  # not removed from the first place yet: it is still there
        return None if _place(record.kind, record.moved_from["spec"]) == new else record.moved_from
    if _place(record.kind, record.spec) == new or (record.phase == Phase.PENDING and record.attempts == 0):
        return None  # the same place, or nothing was made yet
    return {"spec": record.spec, "since": timezone.now().isoformat()}


def _left_behind(record: Record) -> Record | None:
    """The record as it was at the place it moved away from (``delete`` removes the object
    there), or ``None``. Its deletion counts from the move (deadlines on lost machines)."""
    if record.moved_from is None:
        return None
    old = copy.copy(record)
    old.spec = record.moved_from["spec"]
    old.deletion_requested_at = datetime.fromisoformat(record.moved_from["since"])
    return old


def _move_away(record: Record) -> bool:
    """Remove the object from the place ``record`` moved away from, before it is made at the
    new one. False: not done (retried later, or counted as a failed attempt)."""
    old = _left_behind(record)
    if old is None:
        return True
    place = _place(record.kind, old.spec)
    try:
        get_kind(record.kind).delete(old)
    except NotYet as wait:
        _converge_later(record_id=record.pk, retry_in=wait.retry_in)
        return False
    except Exception as exc:
        why = f"removing it from where it was ({_place_text(place)}): {_error_text(exc)}"
        error = PermanentError(why) if isinstance(exc, PermanentError) else KindError(why)
        _converge_failed(record_id=record.pk, error=error)
        return False
    with transaction.atomic():
        fresh = Record.objects.select_for_update(no_key=True).filter(pk=record.pk).first()
        if fresh is not None and fresh.moved_from == record.moved_from:
            Record.objects.filter(pk=record.pk).update(moved_from=None)
            to = _place(record.kind, fresh.spec)
            record_event_write(
                record.pk,
                EventType.NOTE,
                reason="MovedAway",
                message=f"removed from {_place_text(place)}; to be made at {_place_text(to)}",
                data={"from": place, "to": to},
            )
    record.moved_from = None
    return True


def _place_text(place: Mapping[str, Any]) -> str:
    return ", ".join(f"{key} {value if value is not None else '(none)'}" for key, value in place.items())


def _enqueue_converge_on_commit(record_id: Any, countdown: float = 0) -> None:
    from apps.records.tasks import record_converge_task

    transaction.on_commit(lambda: record_converge_task.apply_async((str(record_id),), countdown=countdown))


# --- convergence ------------------------------------------------------------------------------


def record_converge(*, record_id: Any) -> None:
    """Bring one record's external object to its spec through the kind's adopt-or-create."""
    started_at = timezone.now()
    with operation_lock(record_id):
        with transaction.atomic():
            record = Record.objects.select_for_update(no_key=True).filter(pk=record_id).first()
            if record is None or record.deletion_requested_at is not None or record.phase not in _CONVERGIBLE:
                return
            generation = record.generation
            fields = {"next_attempt_at": timezone.now() + _lease()}
            if record.phase == Phase.PENDING:
                _transition([record], Phase.CREATING, reason="Converging", fields=fields)
            else:
                Record.objects.filter(pk=record.pk).update(**fields)
        if not _move_away(record):
            return
        try:
            outputs = get_kind(record.kind).create(record)
        except NotYet as wait:
            _converge_later(record_id=record_id, retry_in=wait.retry_in)
            return
        except Exception as exc:
            failed = domain.RecordConvergeFailed(
                record=record.ref(), started_at=started_at, ended_at=timezone.now(), error=_error_text(exc)
            )
            domain.emit(failed)  # outside a transaction: delivered now, before the failure settles the record
            _converge_failed(record_id=record_id, error=exc)
            return
        with transaction.atomic():
            record = Record.objects.select_for_update(no_key=True).get(pk=record_id)
            if record.deletion_requested_at is not None or record.phase not in _CONVERGIBLE:
                # Deletion began meanwhile: keep what we learned; the delete will remove it.
                Record.objects.filter(pk=record.pk).update(outputs=outputs)
                return
            if record.generation != generation:
                Record.objects.filter(pk=record.pk).update(outputs=outputs)
                _enqueue_converge_on_commit(record.pk)
                return
            now = timezone.now()
            domain.emit(
                domain.RecordConverged(
                    record=record.ref(),
                    started_at=started_at,
                    ended_at=now,
                    created=record.phase != Phase.UPDATING,
                    adopted=bool(outputs.get("adopted")) if isinstance(outputs, dict) else False,
                    healed=record.healing,
                )
            )
            reason = "Healed" if record.healing else "Updated" if record.phase == Phase.UPDATING else "Created"
            _transition(
                [record],
                Phase.READY,
                reason=reason,
                data={"adopted": bool(outputs.get("adopted"))} if isinstance(outputs, dict) else None,
                fields={
                    "outputs": outputs,
                    "observed_generation": generation,
                    "attempts": 0,
                    "next_attempt_at": None,
                    "last_error": "",
                    "healing": False,
                    "heals": record.heals + (1 if record.healing else 0),
                    "observed_at": now,
                    "next_observe_at": _next_observe(record, now, soon=True),
                },
            )


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def record_wake(*, record_id: Any) -> None:
    """What a record's kind waited on (``NotYet``) has happened: run its convergence or its
    deletion again now. A hint only: without it, the retry the kind asked for comes later."""
    from apps.records.tasks import records_delete_task

    record = Record.objects.filter(pk=record_id).values("phase", "deletion_requested_at").first()
    if record is None or record["phase"] == Phase.DELETED:
        return
    if record["deletion_requested_at"] is not None:
        if record["phase"] == Phase.DELETING:
            records_delete_task.delay([str(record_id)])
    elif record["phase"] in _CONVERGIBLE:
        from apps.records.tasks import record_converge_task

        record_converge_task.delay(str(record_id))


def _converge_later(*, record_id: Any, retry_in: float) -> None:
    """The kind's work goes on elsewhere: look again later (or when it wakes us), no attempt counted."""
    retry_in = max(0.0, retry_in)
    with transaction.atomic():
        updated = Record.objects.filter(
            pk=record_id, phase__in=_CONVERGIBLE, deletion_requested_at__isnull=True
        ).update(next_attempt_at=timezone.now() + timedelta(seconds=retry_in) + _lease())
        if updated:
            _enqueue_converge_on_commit(record_id, countdown=retry_in)


@transaction.atomic
def _converge_failed(*, record_id: Any, error: BaseException) -> None:
    record = Record.objects.select_for_update(no_key=True).filter(pk=record_id).first()
    if record is None or record.phase not in _CONVERGIBLE or record.deletion_requested_at is not None:
        return
    attempts = record.attempts + 1
    message = _error_text(error)
    permanent = isinstance(error, PermanentError | UnknownKind)
    now = timezone.now()
    if permanent or attempts >= settings.GRAPHENE_CREATE_ATTEMPTS:
        Event.objects.create(
            **_event_kwargs(
                record.pk, EventType.ERROR, reason="CreateFailed", message=message, data={"attempt": attempts}
            )
        )
        _transition(
            [record],
            Phase.CREATE_FAILED,
            reason="PermanentError" if permanent else "RetriesExhausted",
            message=message,
            fields={"attempts": attempts, "last_error": message, "next_attempt_at": None},
        )
        return
    delay = backoff_seconds(attempts)
    Event.objects.create(
        **_event_kwargs(
            record.pk,
            EventType.ERROR,
            reason="CreateFailed",
            message=message,
            data={"attempt": attempts, "retry_in_s": round(delay, 3)},
        )
    )
    Record.objects.filter(pk=record.pk).update(
        attempts=attempts, last_error=message, next_attempt_at=now + timedelta(seconds=delay) + _lease(), updated_at=now
    )
    _enqueue_converge_on_commit(record.pk, countdown=delay)


# --- deletion ---------------------------------------------------------------------------------


def _live_children() -> Exists:
    return Exists(Record.objects.filter(parent=OuterRef("pk")).exclude(phase=Phase.DELETED))


def _enqueue_deletions_on_commit(rows: Iterable[tuple[Any, Any]]) -> None:
    """Enqueue deletion of (id, parent_id) rows in batches; siblings stay together so the
    task that deletes the last of them can go on with their parent."""
    from apps.records.tasks import records_delete_task

    ids = [str(pk) for pk, _parent in sorted(rows, key=lambda row: str(row[1]))]
    size = max(1, settings.GRAPHENE_DELETE_BATCH)
    batches = [ids[i : i + size] for i in range(0, len(ids), size)]
    if batches:
        transaction.on_commit(lambda: [records_delete_task.delay(batch) for batch in batches])


def record_delete_request(
    *, record: Record, actor: Actor = None, reason: str = "DeleteRequested", message: str = ""
) -> Record:
    """Request deletion of ``record`` and its whole subtree, children first (I3)."""
    with transaction.atomic():
        _lock_tree(record.tree_id)
        record = Record.objects.get(pk=record.pk)
        if record.phase == Phase.DELETED:
            return record
        now = timezone.now()
        subtree = Record.objects.filter(tree_id=record.tree_id, lft__gte=record.lft, rght__lte=record.rght).exclude(
            phase=Phase.DELETED
        )
        marked = subtree.filter(deletion_requested_at__isnull=True).update(
            deletion_requested_at=now, next_attempt_at=now + _lease(), updated_at=now
        )
        Event.objects.create(
            **_event_kwargs(
                record.pk,
                EventType.DELETION_REQUESTED,
                reason=reason,
                message=message or f"deleting {record} and its subtree",
                data={"subtree_records": marked},
                actor=actor,
                at=now,
            )
        )
        frontier = (
            subtree.exclude(phase__in=[Phase.DELETING, Phase.DELETE_FAILED])
            .filter(~_live_children())
            .values_list("pk", "parent_id")
        )
        _enqueue_deletions_on_commit(list(frontier))
        _notify([record.pk])
        record.deletion_requested_at = record.deletion_requested_at or now
    return record


def _run_deletes(records: Sequence[Record], wait_for_create: set[Any]) -> dict[Any, BaseException | None]:
    """Call each kind's delete; independent objects are deleted concurrently."""

    def one(record: Record) -> BaseException | None:
        try:
            kind = get_kind(record.kind)
            left_behind = _left_behind(record)  # a move not finished: the old place first
            if record.pk in wait_for_create:
                with operation_lock(record.pk):
                    if left_behind is not None:
                        kind.delete(left_behind)
                    kind.delete(record)
            else:
                if left_behind is not None:
                    kind.delete(left_behind)
                kind.delete(record)
        except Exception as exc:
            return exc
        return None

    if len(records) == 1:
        return {records[0].pk: one(records[0])}
    if any(r.pk in wait_for_create for r in records):
        # The operation lock uses this thread's database connection: stay on this thread.
        return {r.pk: one(r) for r in records}
    # A kind's delete may use the database (logs, lookups): on a pool thread that opens the
    # thread's own connection, which nothing else would ever close.
    results = _executor().map(closes_connections(one), records)
    return dict(zip((r.pk for r in records), results, strict=True))


_pool: ThreadPoolExecutor | None = None
# Deletes of one batch at once, per process; at most as many database sessions, each closed
# when its delete ends.
DELETE_THREADS = 16


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=DELETE_THREADS, thread_name_prefix="graphene-delete")
    return _pool


def record_delete_batch(*, record_ids: Sequence[Any]) -> None:
    """Delete a batch of records whose children are all gone, then go on up the tree.

    Parents left without live children are deleted by the same task (the next batch), so a
    branch is walked to its top without a round trip through the broker per level; more
    parents than one batch holds are handed to new tasks. If this task dies on the way, its
    redelivery finds the parents again from the ids it was given (see ``_delete_step``), and
    the reconciler is the net below that.
    """
    ids = list(record_ids)
    while ids:
        ids = _delete_step(ids)


def _delete_step(record_ids: Sequence[Any]) -> list[Any]:
    """One batch: claim, call the kinds' deletes, mark deleted. Returns the parents to go on with."""
    with transaction.atomic():
        rows = list(
            Record.objects.select_for_update(no_key=True)
            .filter(pk__in=list(record_ids), deletion_requested_at__isnull=False)
            .exclude(phase=Phase.DELETED)
            .order_by("pk")
        )
        busy = set(
            Record.objects.filter(parent_id__in=[r.pk for r in rows])
            .exclude(phase=Phase.DELETED)
            .values_list("parent_id", flat=True)
        )
        claim = [r for r in rows if r.pk not in busy]
        if not claim:
            if rows:
                return []  # children still live: the task deleting the last of them goes on
            # Everything given is deleted already: a redelivery after this task died further up.
            parent_ids = set(
                Record.objects.filter(pk__in=list(record_ids), parent_id__isnull=False).values_list(
                    "parent_id", flat=True
                )
            )
            return _ready_parents(parent_ids)
        # A record already ``deleting`` was claimed by a batch that died (perhaps while waiting
        # for an in-flight create): take the operation lock again rather than race that create.
        resumed = [r.pk for r in claim if r.phase == Phase.DELETING]
        wait_for_create = {r.pk for r in claim if r.phase in _CREATE_IN_FLIGHT} | set(resumed)
        lease = {"next_attempt_at": timezone.now() + _lease()}
        _transition([r for r in claim if r.phase != Phase.DELETING], Phase.DELETING, reason="Deleting", fields=lease)
        if resumed:
            Record.objects.filter(pk__in=resumed).update(**lease)

    started_at = timezone.now()
    results = _run_deletes(claim, wait_for_create)

    with transaction.atomic():
        parent_ids = {r.parent_id for r in claim if r.parent_id is not None}
        _lock_rows(parent_ids)  # siblings finishing concurrently serialize here: one sees all gone
        # A duplicate message (a redelivery after a worker died, the reconciler) may have run
        # the same deletes meanwhile: re-read our rows under their locks and finish only those
        # still deleting, so each record is marked deleted exactly once.
        fresh = {
            r.pk: r
            for r in Record.objects.select_for_update(no_key=True).filter(pk__in=[r.pk for r in claim]).order_by("pk")
        }
        claim = [fresh[r.pk] for r in claim if r.pk in fresh and fresh[r.pk].phase == Phase.DELETING]
        now = timezone.now()
        done = [r for r in claim if results[r.pk] is None]
        waiting = [r for r in claim if isinstance(results[r.pk], NotYet)]
        claim = [r for r in claim if not isinstance(results[r.pk], NotYet)]
        if waiting:
            _delete_later(waiting, results, now)
        if claim:
            domain.emit(
                domain.RecordsDeleted(
                    records=tuple(r.ref() for r in claim),  # as they were before the phases change
                    errors={str(r.pk): _error_or_none(results[r.pk]) for r in claim},
                    started_at=started_at,
                    ended_at=now,
                )
            )
        _transition(
            done,
            Phase.DELETED,
            reason="Deleted",
            fields={
                "deleted_at": now,
                "next_attempt_at": None,
                "attempts": 0,
                "last_error": "",
                "next_observe_at": None,
            },
        )
        for record in claim:
            error = results[record.pk]
            if error is not None:
                _delete_failed(record, error)
        return _ready_parents(parent_ids)


def _error_or_none(error: BaseException | None) -> str | None:
    return None if error is None else _error_text(error)


def _ready_parents(parent_ids: Iterable[Any]) -> list[Any]:
    """Parents being deleted whose children are all gone: one batch to go on with; any more
    are enqueued (on commit) for other workers."""
    ready = list(
        Record.objects.filter(pk__in=list(parent_ids), deletion_requested_at__isnull=False)
        .exclude(phase__in=[Phase.DELETED, Phase.DELETING, Phase.DELETE_FAILED])
        .filter(~_live_children())
        .order_by("parent_id", "pk")
        .values_list("pk", "parent_id")
    )
    size = max(1, settings.GRAPHENE_DELETE_BATCH)
    _enqueue_deletions_on_commit(ready[size:])
    return [pk for pk, _parent in ready[:size]]


def _delete_later(records: Sequence[Record], results: Mapping[Any, BaseException | None], now: datetime) -> None:
    """Deletions under way elsewhere: they stay ``deleting``; look again later (or when woken)."""
    from apps.records.tasks import records_delete_task

    for record in records:
        wait = results[record.pk]
        retry_in = max(0.0, wait.retry_in if isinstance(wait, NotYet) else 5.0)
        Record.objects.filter(pk=record.pk).update(
            next_attempt_at=now + timedelta(seconds=retry_in) + _lease(), updated_at=now
        )
        transaction.on_commit(partial(records_delete_task.apply_async, ([str(record.pk)],), countdown=retry_in))


def _delete_failed(record: Record, error: BaseException) -> None:
    from apps.records.tasks import records_delete_task

    attempts = record.attempts + 1
    delay = backoff_seconds(attempts)
    message = _error_text(error)
    now = timezone.now()
    Event.objects.create(
        **_event_kwargs(
            record.pk,
            EventType.ERROR,
            reason="DeleteFailed",
            message=message,
            data={"attempt": attempts, "retry_in_s": round(delay, 3)},
            at=now,
        )
    )
    _transition(
        [record],
        Phase.DELETE_FAILED,
        reason="DeleteFailed",
        message=message,
        fields={
            "attempts": attempts,
            "last_error": message,
            "next_attempt_at": now + timedelta(seconds=delay) + _lease(),
        },
    )
    record_id = str(record.pk)
    transaction.on_commit(lambda: records_delete_task.apply_async(([record_id],), countdown=delay))


# --- lifetime ---------------------------------------------------------------------------------


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
    Record.objects.filter(pk=record.pk).update(expires_at=expires_at, updated_at=timezone.now())
    record.expires_at = expires_at
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
    _notify([record.pk])
    return record


def record_extend(*, record: Record, by: timedelta, actor: Actor = None) -> Record:
    """Push the deadline ``by`` further (from now if the record had none)."""
    if by <= timedelta(0):
        raise ValidationFailed("extend by a positive duration", fields={"by": ["must be positive"]})
    start = max(record.expires_at or timezone.now(), timezone.now())
    return record_set_expiry(record=record, expires_at=start + by, actor=actor, reason="Extended")


def record_release(*, record: Record, actor: Actor = None) -> Record:
    """Remove the deadline: the record lives until its owner dies or someone deletes it."""
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


# --- transfer ---------------------------------------------------------------------------------


def record_transfer(
    *,
    record: Record,
    new_owner: Record,
    given_by: Record | None = None,
    expires_at: datetime | None = None,
    actor: Actor = None,
) -> Record:
    """Give ``record`` and its subtree to ``new_owner`` atomically.

    Ownership is given, never taken: when ``given_by`` is passed (a run handing over what it
    owns) it must be the current owner. Refuses roots, cycles and owners being deleted.
    """
    if record.is_root:
        raise ValidationFailed(
            f"{record.kind} records are roots; they cannot be given away", fields={"record": ["is a root"]}
        )
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationFailed("expires_at is in the past", fields={"expires_at": ["must be in the future"]})
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
        if (
            Record.objects.filter(parent=new_owner, kind=record.kind, name=record.name)
            .exclude(phase=Phase.DELETED)
            .exists()
        ):
            raise Conflict(f"{new_owner} already owns a live {record.kind} named {record.name!r}")
        size = record.get_descendant_count() + 1
        Record.objects.move_node(record, new_owner, position="last-child")
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
        _notify([record.pk, old_owner_id, new_owner.pk])
    return Record.objects.get(pk=record.pk)


# --- reconciliation and housekeeping ----------------------------------------------------------


def records_reconcile(*, now: datetime | None = None, limit: int = 500) -> int:
    """Re-enqueue work whose lease ran out (a lost message or a dead worker): never lost, only late."""
    from apps.records.tasks import records_delete_task

    now = now or timezone.now()
    with transaction.atomic():
        due = list(
            Record.objects.select_for_update(skip_locked=True, no_key=True)
            .filter(next_attempt_at__lte=now)
            .annotate(has_live_children=_live_children())
            .order_by("next_attempt_at")[:limit]
        )
        if not due:
            return 0
        # Back off per record: a record that has waited long is more likely behind a long
        # queue than lost, and re-sending it every lease would only grow that queue.
        cap = max(_lease(), timedelta(seconds=60))
        for record in due:
            waited = max(now - record.updated_at, timedelta(0))
            record.next_attempt_at = now + min(max(_lease(), waited), cap)
        Record.objects.bulk_update(due, ["next_attempt_at"])
        converge, delete, idle = [], [], []
        for record in due:
            if record.phase == Phase.DELETED:
                idle.append(record.pk)
            elif record.deletion_requested_at is not None:
                if not record.has_live_children:
                    delete.append(str(record.pk))
            elif record.phase in _CONVERGIBLE:
                converge.append(record.pk)
            else:
                idle.append(record.pk)
        Record.objects.filter(pk__in=idle).update(next_attempt_at=None)
        for pk in converge:
            _enqueue_converge_on_commit(pk)
        if delete:
            transaction.on_commit(lambda: [records_delete_task.delay([pk]) for pk in delete])
    return len(converge) + len(delete)


# --- drift ------------------------------------------------------------------------------------

# Shortly after a change (created, updated, healed, drift resolved) a record is observed
# sooner: after this fraction of its interval, at least OBSERVE_SOON_MIN.
OBSERVE_SOON_FRACTION = 0.1
OBSERVE_SOON_MIN = timedelta(seconds=2)
_OBSERVABLE = frozenset({Phase.READY, Phase.DRIFTED})


def observe_interval(record: Record) -> timedelta | None:
    """How often ``record`` is observed: its ``observe_every``, else its kind's interval."""
    kind = registry().get(record.kind)
    if kind is None or kind.drift_interval is None:
        return None
    if record.observe_every:
        return timedelta(seconds=record.observe_every)
    return kind.drift_interval


def _next_observe(record: Record, now: datetime, *, soon: bool = False) -> datetime | None:
    interval = observe_interval(record)
    if interval is None:
        return None
    if soon:
        return now + min(interval, max(interval * OBSERVE_SOON_FRACTION, OBSERVE_SOON_MIN))
    return now + interval


def records_observe_due(*, now: datetime | None = None, limit: int | None = None) -> int:
    """Beat: claim the records due for observation (through the partial index, oldest first)
    and enqueue them in batches. A claim pushes ``next_observe_at`` one lease ahead, so a lost
    batch is picked up again after the lease; the batch sets the real next time."""
    from apps.records.tasks import records_observe_task

    now = now or timezone.now()
    limit = limit or settings.GRAPHENE_OBSERVE_SCAN_LIMIT
    with transaction.atomic():
        due = list(
            Record.objects.select_for_update(skip_locked=True, no_key=True)
            .filter(next_observe_at__lte=now)
            .order_by("next_observe_at")
            .values_list("pk", flat=True)[:limit]
        )
        if not due:
            return 0
        Record.objects.filter(pk__in=due).update(next_observe_at=now + _lease())
        size = max(1, settings.GRAPHENE_OBSERVE_BATCH)
        batches = [[str(pk) for pk in due[i : i + size]] for i in range(0, len(due), size)]
        transaction.on_commit(lambda: [records_observe_task.delay(batch) for batch in batches])
    return len(due)


def records_observe(*, record_ids: Sequence[Any]) -> dict[str, int]:
    """Observe a batch: each kind's ``observe`` and ``diff``, outside any transaction; records
    found as specified get their next observation in one UPDATE per interval; drift is handled
    per record under its lock. Returns counts (clean, drifted, healing, resolved, skipped, failed)."""
    counts = dict.fromkeys(("clean", "drifted", "healing", "resolved", "skipped", "failed"), 0)
    now = timezone.now()
    clean: defaultdict[timedelta, list[Any]] = defaultdict(list)
    later: defaultdict[timedelta, list[Any]] = defaultdict(list)
    skipped: list[Any] = []
    changed: list[tuple[Record, list[Drift] | None]] = []
    for record in Record.objects.filter(pk__in=list(record_ids)):
        interval = observe_interval(record)
        if interval is None or record.phase not in _OBSERVABLE or record.deletion_requested_at is not None:
            skipped.append(record.pk)
            continue
        kind = get_kind(record.kind)
        try:
            observed: Observed | None = kind.observe(record)
            drifts = kind.diff(record, observed) if observed is not None else None
        except NotYet:  # cannot look now (its agent is away): look again next interval, quietly
            later[interval].append(record.pk)
            continue
        except Exception as exc:  # the kind could not look (engine down, network): try again later
            counts["failed"] += 1
            _observe_failed(record, exc, now + interval)
            continue
        if drifts == [] and record.phase == Phase.READY:
            clean[interval].append(record.pk)
        else:
            changed.append((record, drifts))
    for interval, ids in clean.items():
        counts["clean"] += Record.objects.filter(
            pk__in=ids, phase=Phase.READY, deletion_requested_at__isnull=True
        ).update(next_observe_at=now + interval, observed_at=now)
    for interval, ids in later.items():
        counts["skipped"] += Record.objects.filter(pk__in=ids, next_observe_at__isnull=False).update(
            next_observe_at=now + interval
        )
    if skipped:
        counts["skipped"] += Record.objects.filter(pk__in=skipped).update(next_observe_at=None)
    for record, drifts in changed:
        counts[_drift_handle(record.pk, drifts, now)] += 1
    return counts


@transaction.atomic
def _drift_handle(record_id: Any, drifts: list[Drift] | None, now: datetime) -> str:
    """Act on one observation that did not match (``drifts``; None: the object is gone), or a
    drifted record that matches again (``[]``), under the record's lock."""
    record = Record.objects.select_for_update(no_key=True).filter(pk=record_id).first()
    if record is None or record.phase not in _OBSERVABLE or record.deletion_requested_at is not None:
        return "skipped"  # it changed meanwhile (deleted, updating): its new phase decides
    if drifts == []:
        if record.phase == Phase.READY:
            return "skipped"
        _transition(
            [record],
            Phase.READY,
            reason="DriftResolved",
            fields={"observed_at": now, "next_observe_at": _next_observe(record, now, soon=True)},
        )
        return "resolved"
    gone = drifts is None
    changes = [{"field": d.field, "desired": d.desired, "actual": d.actual} for d in drifts or []]
    if record.phase == Phase.DRIFTED and record.drift_policy == DriftPolicy.REPORT:
        # Reported already: keep watching (it may come back), without an event per look.
        Record.objects.filter(pk=record.pk).update(observed_at=now, next_observe_at=_next_observe(record, now))
        return "drifted"
    what = "is gone" if gone else "differs from its spec in " + ", ".join(c["field"] for c in changes)
    Event.objects.create(
        **_event_kwargs(
            record.pk,
            EventType.DRIFT_DETECTED,
            reason="Gone" if gone else "Drifted",
            message=f"{record} {what}",
            data={"gone": gone, "changes": changes, "policy": record.drift_policy},
            at=now,
        )
    )
    domain.emit(domain.RecordDrifted(record=record.ref(), gone=gone))
    if record.drift_policy == DriftPolicy.HEAL:
        _transition(
            [record],
            Phase.CREATING if gone else Phase.UPDATING,
            reason="Healing",
            message=f"{record} {what}: re-converging",
            fields={
                "healing": True,
                "observed_at": now,
                "next_observe_at": None,
                "attempts": 0,
                "next_attempt_at": now + _lease(),
            },
        )
        _enqueue_converge_on_commit(record.pk)
        return "healing"
    _transition(
        [record],
        Phase.DRIFTED,
        reason="Gone" if gone else "Drifted",
        message=f"{record} {what}",
        fields={"observed_at": now, "next_observe_at": _next_observe(record, now)},
    )
    return "drifted"


def _observe_failed(record: Record, error: BaseException, retry_at: datetime) -> None:
    message = _error_text(error)
    with transaction.atomic():
        Event.objects.create(
            **_event_kwargs(record.pk, EventType.ERROR, reason="ObserveFailed", message=message, data={})
        )
        Record.objects.filter(pk=record.pk, next_observe_at__isnull=False).update(next_observe_at=retry_at)


def records_purge(*, now: datetime | None = None, limit: int = 100) -> int:
    """Remove tombstones older than the retention, whole deleted subtrees at a time."""
    cutoff = (now or timezone.now()) - settings.GRAPHENE_TOMBSTONE_RETENTION
    tops = list(
        Record.objects.filter(deleted_at__lt=cutoff)
        .filter(Q(parent__isnull=True) | ~Q(parent__phase=Phase.DELETED))
        .order_by("deleted_at")[:limit]
    )
    purged = 0
    for top in tops:
        with transaction.atomic():
            _lock_tree(top.tree_id)
            fresh = Record.objects.filter(pk=top.pk).first()
            if fresh is None:
                continue
            subtree = Record.objects.filter(tree_id=fresh.tree_id, lft__gte=fresh.lft, rght__lte=fresh.rght)
            if subtree.exclude(phase=Phase.DELETED).exists():
                continue  # a live descendant (cannot happen children-first, but never drop it)
            purged += subtree.count()
            fresh.delete()  # mptt closes the gap; events go with the rows
    return purged


SWEEPER_NAME = "sweeper"


def records_sweep(*, dry_run: bool = False) -> list[dict[str, Any]]:
    """Find external objects carrying a marker whose record is deleted or unknown; delete them.

    Each finding is reported as an event on the ``graphene.sweeper`` root record.
    """
    from kinds import registry

    sweeper = record_ensure_root(kind="graphene.sweeper", name=SWEEPER_NAME)
    findings: list[dict[str, Any]] = []
    for kind_name, kind in sorted(registry().items()):
        marked = list(kind.sweep())
        ids = {m.record_id for m in marked}
        valid = {i for i in ids if _is_uuid(i)}
        live = set(
            str(pk)
            for pk in Record.objects.filter(pk__in=valid).exclude(phase=Phase.DELETED).values_list("pk", flat=True)
        )
        for item in marked:
            if item.record_id in live:
                continue
            known = _is_uuid(item.record_id) and Record.objects.filter(pk=item.record_id).exists()
            finding = {
                "kind": kind_name,
                "external_id": item.external_id,
                "record_id": item.record_id,
                "record": "deleted" if known else "unknown",
            }
            if dry_run:
                findings.append({**finding, "action": "none (dry run)"})
                continue
            try:
                kind.delete_external(item.external_id)
            except Exception as exc:
                finding["error"] = _error_text(exc)
                Event.objects.create(
                    **_event_kwargs(
                        sweeper.pk,
                        EventType.ORPHAN_DELETE_FAILED,
                        reason="Orphan",
                        message=finding["error"],
                        data=finding,
                    )
                )
            else:
                Event.objects.create(
                    **_event_kwargs(
                        sweeper.pk,
                        EventType.ORPHAN_DELETED,
                        reason="Orphan",
                        message=f"deleted {kind_name} object {item.external_id} (record {finding['record']})",
                        data=finding,
                    )
                )
            findings.append(finding)
    return findings


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
