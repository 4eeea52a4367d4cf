"""Declaring records: validation of kinds, specs, labels and drift options; roots (runs,
stands, the sweeper); a declaration under an owner, committed ``pending`` before anything
exists outside (I1), and a re-declaration that becomes the next generation."""

from __future__ import annotations

import functools
import uuid
from collections import defaultdict
from datetime import datetime
from typing import Any

import jsonschema
from django.db import connection, transaction
from django.utils import timezone

from apps.core import validation
from apps.core.db import advisory_xact_lock, insert_rows, is_postgresql, json_rows, prepared_cursor
from apps.core.errors import Conflict, ValidationFailed
from apps.core.models import AuditEntry
from apps.records.choices import ROOT_KINDS, DriftPolicy, EventType, Phase
from apps.records.models import Event, Record
from apps.records.services.placement import _moved_from, _place
from apps.records.services.protect import protected_by, protected_declare, protected_event_row
from apps.records.services.transitions import (
    Actor,
    _audit,
    _audit_row,
    _audited,
    _enqueue_converge_on_commit,
    _event,
    _lease,
    _lock_tree,
    _notify,
    _owner_check_alive,
    _transition,
)
from kinds import Kind, UnknownKind, get_kind


def kind_resolve(name: str) -> Kind:
    validation.check_text(name, field="kind")
    try:
        return get_kind(name)
    except UnknownKind as exc:
        raise ValidationFailed(str(exc), fields={"kind": [str(exc)]}) from None


def spec_validate(kind: Kind, spec: Any) -> dict[str, Any]:
    """Check ``spec`` against the kind's JSON Schema; all violations, by field path."""
    if not isinstance(spec, dict):
        raise ValidationFailed("spec must be a JSON object", fields={"spec": ["must be a JSON object"]})
    validation.check_json(spec, path="spec", what="the spec")  # what PostgreSQL can store, whatever the kind
    validator = _validator(kind)
    errors: dict[str, list[str]] = defaultdict(list)
    for error in sorted(validator.iter_errors(spec), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in ["spec", *error.absolute_path])
        errors[path].append(error.message)
    if errors:
        summary = "; ".join(f"{k}: {', '.join(v)}" for k, v in errors.items())
        raise ValidationFailed(f"spec does not match kind {kind.name}: {summary}", fields=dict(errors))
    return spec


@functools.lru_cache(maxsize=256)
def _validator(kind: Kind) -> jsonschema.Draft202012Validator:
    """A kind's spec validator, made once per kind (a kind's schema does not change)."""
    return jsonschema.Draft202012Validator(kind.spec_schema)


def labels_validate(labels: Any) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise ValidationFailed("labels must map strings to strings", fields={"labels": ["must map strings to strings"]})
    validation.check_json(labels, path="labels", what="the labels")
    bad = [k for k in labels if not k or len(k) > 63 or "=" in k or "," in k]
    if bad:
        raise ValidationFailed(
            f"invalid label keys {bad}: 1-63 characters, no '=' or ','", fields={"labels": [f"invalid keys {bad}"]}
        )
    return labels


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
    """Create a root (a run, a stand or the sweeper): the top of a new, separate tree.

    A run's root takes no lock: its tree id comes from a sequence (``RecordManager``) and no
    other root can hold its name. A named root (a stand, the sweeper) is one live root per
    kind, namespace and name: those wait for each other, so that the check below is true when
    the row is written. Inside the caller's transaction a run's root costs no savepoint: what
    can be refused is refused before anything is written, and after that only the database can
    fail, which fails the caller's transaction anyway."""
    if kind not in ROOT_KINDS:
        raise ValidationFailed(f"{kind} is not a root kind", fields={"kind": [f"roots are {sorted(ROOT_KINDS)}"]})
    validation.check_text(name, field="name")
    validation.check_text(namespace, field="namespace")
    validation.check_json(spec or {}, path="spec", what="the spec")
    labels = labels_validate(labels)
    named = kind != "graphene.run"
    with transaction.atomic(savepoint=named):
        if named:
            advisory_xact_lock(0x6772617068656E65)  # "graphene": named roots, one after the other
            if (
                Record.objects.filter(kind=kind, namespace=namespace, name=name, parent__isnull=True)
                .exclude(phase=Phase.DELETED)
                .exists()
            ):
                raise Conflict(f"a live {kind} named {name!r} already exists")
        record = _root(kind=kind, name=name, namespace=namespace, spec=spec or {}, labels=labels, phase=phase)
        record.save(force_insert=True)  # a new root: mptt gives it the next tree id
        _root_created(record, actor=actor).save(force_insert=True)
        if named:  # a run's root is its run (the same id): run.start is its row
            _audit("record.create", record, actor=actor, before=None, after=_audited(record))
        _notify([record])
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


def run_root_rows(
    *, record_id: uuid.UUID, name: str, namespace: str, tree_id: int, actor: Actor = None
) -> tuple[Record, Event]:
    """A run's root ``record_id`` (the top of tree ``tree_id``, numbered by the caller from
    the tree id sequence) and its ``Created`` event, unsaved: for a run start that writes them
    in the statement that writes the run (``run_root_written`` once it has)."""
    validation.check_text(name, field="name")
    validation.check_text(namespace, field="namespace")
    record = _root(kind="graphene.run", name=name, namespace=namespace, spec={}, labels={}, phase=Phase.READY)
    record.id = record_id
    record.tree_id, record.lft, record.rght, record.level = tree_id, 1, 2, 0  # alone in its tree
    return record, _root_created(record, actor=actor)


def _root(*, kind: str, name: str, namespace: str, spec: dict[str, Any], labels: dict[str, str], phase: str) -> Record:
    """A new root, unsaved: nothing to converge (its generation observed already)."""
    return Record(
        kind=kind, name=name, namespace=namespace, spec=spec, labels=labels, phase=phase, observed_generation=1
    )


def _root_created(record: Record, *, actor: Actor) -> Event:
    """A new root's first event, unsaved."""
    return _event(record.pk, EventType.DECLARED, reason="Created", actor=actor)


def run_root_written(record: Record) -> None:
    """``run_root_rows``'s root is in the database: the instance says so and watchers are told."""
    record._state.adding = False
    record._state.db = connection.alias
    _notify([record])


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
    protect: bool = False,
    actor: Actor = None,
) -> Record:
    """Declare a record under ``owner``: committed in ``pending``, convergence enqueued on commit.

    Re-declaring the same (owner, kind, name) with the same spec returns the existing record;
    with a different spec it becomes the next generation and re-converges. ``drift_policy``
    (heal or report) and ``observe_every`` (seconds; default: the kind's drift interval) say
    how the drift scheduler treats it once ready. ``protect`` protects it (``services.protect``);
    a re-declaration without it leaves a protection as it is (only an unprotect removes one).
    """
    kind_obj = kind_resolve(kind)
    if kind in ROOT_KINDS:
        raise ValidationFailed(f"{kind} records are roots and cannot be owned", fields={"kind": ["is a root kind"]})
    if not name or len(name) > 253:
        raise ValidationFailed("name must be 1-253 characters", fields={"name": ["must be 1-253 characters"]})
    validation.check_text(name, field="name")
    spec = spec_validate(kind_obj, {} if spec is None else spec)
    labels = labels_validate(labels)
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationFailed("expires_at is in the past", fields={"expires_at": ["must be in the future"]})
    drift = drift_options_validate(drift_policy, observe_every)
    tree_id = owner.tree_id
    while True:
        try:
            with transaction.atomic():
                return _declare_in_tree(
                    tree_id,
                    owner=owner,
                    kind=kind,
                    name=name,
                    spec=spec,
                    labels=labels,
                    expires_at=expires_at,
                    drift=drift,
                    protect=protect,
                    actor=actor,
                )
        except _OwnerMoved as moved:  # a transfer took the owner to another tree meanwhile
            tree_id = moved.tree_id


class _OwnerMoved(Exception):
    def __init__(self, tree_id: int) -> None:
        self.tree_id = tree_id


def _declare_in_tree(
    tree_id: int,
    *,
    owner: Record,
    kind: str,
    name: str,
    spec: dict[str, Any],
    labels: dict[str, str],
    expires_at: datetime | None,
    drift: dict[str, Any],
    protect: bool,
    actor: Actor,
) -> Record:
    """``record_declare`` under the lock of the owner's tree ``tree_id`` (the only lock it takes).

    The new record, its events and its audit row are built here; what only the database knows
    under the lock (the owner's bounds, whether it still lives, a sibling of the same kind and
    name) is decided by the statement that writes them (``_insert_child``)."""
    _lock_tree(tree_id)
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
        protected=protect,
        protected_by=protected_by(actor) if protect else "",
        protected_at=now if protect else None,
        created_at=now,
        updated_at=now,
        **drift,
    )
    events = [
        _event(
            record.pk,
            EventType.DECLARED,
            reason="Declared",
            data={"owner": str(owner.pk), "generation": 1, **({"protected": True} if protect else {})},
            actor=actor,
            at=now,
        )
    ]
    if protect:
        events.append(protected_event_row(record, actor=actor, declared=True))
    row = _audit_row("record.create", record, actor=actor, before=None, after=_audited(record), owner=owner.pk)
    if is_postgresql():
        created = _insert_child(record, owner, tree_id, events, row)
    else:
        created = _insert_child_orm(record, owner, tree_id, events, row)
    if not created:
        return _declare_existing(
            owner, kind=kind, name=name, spec=spec, labels=labels, drift=drift, protect=protect, actor=actor
        )
    _notify([record])
    _enqueue_converge_on_commit(record.pk)
    return record


# A live sibling of the same kind and name (being deleted or not) makes it a re-declaration:
# asked as two lookups, each matching the predicate of one partial index (record_unique_live_child,
# record_child_deleting); one condition for both matched neither, and the planner read every
# child of the owner.
#
# The new record's place: the owner's last child, at the start of the owner's free numbers
# (``tree_slack``, at the right end of its bounds), which shrink by two; nothing else is
# written. An owner without two free numbers grows first, by its own width and at least 64
# (room for 32 children without growing again): it and its ancestors (``up``, found by
# ``parent_id``) end that much further right, and the records to the right of the owner move
# as far. So an owner of n children moves the rest of the tree about log2(n) times, not n
# times. There is nothing to the right of the owner when each of its ancestors ends right
# after it (root.rght - owner.rght = owner.level), as for a run's own records; then the move
# is not even looked for. The ancestors are written by primary key (``= ANY``: the planner
# cannot count a recursive query's rows and would scan the table for an ``IN``).
_INSERT_CHILD = """
WITH RECURSIVE up AS (
    SELECT id, parent_id, tree_id, lft, rght, level, tree_slack, phase, deletion_requested_at
    FROM records_record WHERE id = %(owner)s
    UNION ALL
    SELECT r.id, r.parent_id, r.tree_id, r.lft, r.rght, r.level, r.tree_slack, r.phase, r.deletion_requested_at
    FROM records_record r JOIN up ON r.id = up.parent_id
), o AS (
    SELECT up.*, (SELECT root.rght FROM up root WHERE root.parent_id IS NULL) - up.rght = up.level AS on_edge,
           CASE WHEN up.tree_slack >= 2 THEN 0 ELSE GREATEST(up.rght - up.lft + 1, 64) END AS grow_by
    FROM up WHERE up.id = %(owner)s
), ok AS (
    SELECT o.* FROM o
    WHERE o.tree_id = %(tree)s AND o.phase <> 'deleted' AND o.deletion_requested_at IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM records_record c
          WHERE c.parent_id = o.id AND c.kind = %(kind)s AND c.name = %(name)s AND c.phase <> 'deleted'
            AND c.deletion_requested_at IS NULL
      ) AND NOT EXISTS (
          SELECT 1 FROM records_record c
          WHERE c.parent_id = o.id AND c.kind = %(kind)s AND c.name = %(name)s AND c.phase <> 'deleted'
            AND c.deletion_requested_at IS NOT NULL
      )
), owner_row AS (
    UPDATE records_record r SET rght = r.rght + ok.grow_by, tree_slack = r.tree_slack + ok.grow_by - 2
    FROM ok WHERE r.id = ok.id
), grow AS (
    UPDATE records_record r SET rght = r.rght + ok.grow_by
    FROM ok WHERE ok.grow_by > 0 AND r.id = ANY(ARRAY(SELECT id FROM up WHERE id <> %(owner)s))
), shift AS (
    UPDATE records_record r SET lft = r.lft + ok.grow_by, rght = r.rght + ok.grow_by
    FROM ok
    WHERE ok.grow_by > 0 AND NOT ok.on_edge AND r.tree_id = ok.tree_id AND r.lft > ok.rght
), ins AS (
    INSERT INTO records_record ({record_columns}, lft, rght, tree_id, level)
    SELECT x.*, ok.rght - ok.tree_slack, ok.rght - ok.tree_slack + 1, ok.tree_id, ok.level + 1
    FROM ok, jsonb_to_recordset(%(record)s::jsonb) AS x({record_recordset})
    RETURNING lft, rght, tree_id, level
), ev AS (
    INSERT INTO records_event ({event_columns})
    SELECT x.* FROM jsonb_to_recordset(%(events)s::jsonb) AS x({event_recordset})
    WHERE EXISTS (SELECT 1 FROM ins)
), au AS (
    INSERT INTO core_auditentry ({audit_columns})
    SELECT x.* FROM jsonb_to_recordset(%(audit)s::jsonb) AS x({audit_recordset})
    WHERE EXISTS (SELECT 1 FROM ins)
)
SELECT o.tree_id, o.phase, o.deletion_requested_at, i.lft, i.rght, i.tree_id, i.level FROM o LEFT JOIN ins i ON true
"""


# The columns the statement sets itself (the new record's place), not from its JSON row.
_TREE_COLUMNS = ("lft", "rght", "tree_id", "level")


@functools.cache
def _insert_child_sql() -> str:
    """``_INSERT_CHILD`` for the columns of records, events and audit rows (made once per
    process), its whitespace collapsed: under 4 KiB, psycopg keeps its parse of the statement
    instead of parsing it again at each execution (``x.*`` instead of the column lists helps
    too: a recordset's columns come in the order of the insert's)."""
    record, event, audit = json_rows(Record, [], exclude=_TREE_COLUMNS), json_rows(Event, []), json_rows(AuditEntry, [])
    sql = _INSERT_CHILD.format(
        record_columns=", ".join(record.columns),
        record_recordset=record.recordset,
        event_columns=", ".join(event.columns),
        event_recordset=event.recordset,
        audit_columns=", ".join(audit.columns),
        audit_recordset=audit.recordset,
    )
    return " ".join(sql.split()).replace(", ", ",").replace("( ", "(").replace(" )", ")")


def _insert_child(record: Record, owner: Record, tree_id: int, events: list[Event], row: AuditEntry) -> bool:
    """PostgreSQL: insert ``record`` as ``owner``'s last child with its events and audit row,
    in one statement (the tree's root is locked). Returns False when the owner already has a
    live child of that kind and name (nothing is written); raises ``Conflict`` when the owner is
    gone or being deleted and ``_OwnerMoved`` when it is in another tree now."""
    params = {
        "owner": owner.pk,
        "tree": tree_id,
        "kind": record.kind,
        "name": record.name,
        "record": json_rows(Record, [record], exclude=_TREE_COLUMNS).param,
        "events": json_rows(Event, events).param,
        "audit": json_rows(AuditEntry, [row]).param,
    }
    with prepared_cursor() as cursor:
        cursor.execute(_insert_child_sql(), params)
        result = cursor.fetchone()
    if result is None:
        raise Conflict(f"owner {owner} ({owner.pk}) no longer exists; it cannot own new records")
    owner_tree, phase, deletion_requested_at, lft, rght, new_tree, level = result
    if owner_tree != tree_id:
        raise _OwnerMoved(owner_tree)
    if phase == Phase.DELETED or deletion_requested_at is not None:
        owner.phase, owner.deletion_requested_at = phase, deletion_requested_at
        _owner_check_alive(owner)
    if lft is None:
        return False
    record.lft, record.rght, record.tree_id, record.level = lft, rght, new_tree, level
    record._state.adding = False
    record._state.db = connection.alias
    return True


def _insert_child_orm(record: Record, owner: Record, tree_id: int, events: list[Event], row: AuditEntry) -> bool:
    """``_insert_child`` for SQLite (embedded mode): the same checks, then django-mptt's insert
    and one INSERT each for the events and the audit row."""
    fresh = Record.objects.get(pk=owner.pk)  # fresh tree columns, under the lock
    if fresh.tree_id != tree_id:
        raise _OwnerMoved(fresh.tree_id)
    _owner_check_alive(fresh)
    if Record.objects.filter(parent=fresh, kind=record.kind, name=record.name).exclude(phase=Phase.DELETED).exists():
        return False
    record.parent = fresh
    record.save(force_insert=True)  # mptt places it as the owner's last child
    insert_rows(Event, events)
    insert_rows(AuditEntry, [row])
    return True


def _declare_existing(
    owner: Record,
    *,
    kind: str,
    name: str,
    spec: dict[str, Any],
    labels: dict[str, str],
    drift: dict[str, Any],
    protect: bool,
    actor: Actor,
) -> Record:
    """A re-declaration: the owner has a live record of that kind and name already."""
    existing = Record.objects.filter(parent=owner, kind=kind, name=name).exclude(phase=Phase.DELETED).first()
    assert existing is not None  # the tree is locked: the sibling found under the lock is still there
    record = _redeclare(existing, spec=spec, labels=labels, drift=drift, actor=actor)
    if protect and not record.protected:
        record = Record.objects.select_for_update(no_key=True).get(pk=record.pk)
        before = _audited(record)
        protected_declare(record, actor=actor)
        _audit("record.protect", record, actor=actor, before=before, after=_audited(record))
        _notify([record])
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
        drift_before = _audited(existing)
        Record.objects.filter(pk=existing.pk).update(**drift)
        for key, value in drift.items():
            setattr(existing, key, value)
        if existing.spec == spec and existing.labels == labels:  # only the drift options changed
            _audit("record.update", existing, actor=actor, before=drift_before, after=_audited(existing))
    if existing.spec == spec and existing.labels == labels:
        return existing
    record = Record.objects.select_for_update(no_key=True).get(pk=existing.pk)
    if record.deletion_requested_at is not None:
        raise Conflict(f"{record} ({record.pk}) is being deleted; wait for it to finish before re-declaring it")
    before = _audited(record)
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
    _audit("record.update", record, actor=actor, before=before, after=_audited(record), generation=generation)
    _enqueue_converge_on_commit(record.pk)
    return record
