"""Declaring records: validation of kinds, specs, labels and drift options; roots (runs,
stands, the sweeper); a declaration under an owner, committed ``pending`` before anything
exists outside (I1), and a re-declaration that becomes the next generation."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

import jsonschema
from django.db import transaction
from django.utils import timezone

from apps.core import validation
from apps.core.db import advisory_xact_lock
from apps.core.errors import Conflict, ValidationFailed
from apps.records.choices import ROOT_KINDS, DriftPolicy, EventType, Phase
from apps.records.models import Event, Record
from apps.records.services.placement import _moved_from, _place
from apps.records.services.protect import protected_by, protected_declare, protected_event
from apps.records.services.transitions import (
    Actor,
    _audit,
    _audited,
    _enqueue_converge_on_commit,
    _event_kwargs,
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
        record = Record(
            kind=kind,
            name=name,
            namespace=namespace,
            spec=spec or {},
            labels=labels,
            phase=phase,
            observed_generation=1,
        )
        record.save(force_insert=True)  # a new root: mptt gives it the next tree id
        Event.objects.create(**_event_kwargs(record.pk, EventType.DECLARED, reason="Created", actor=actor))
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
    with transaction.atomic():
        if owner.parent_id is None:
            # A root (roots stay roots): its row is the tree's lock, and locking it reads it
            # fresh; one statement instead of two for every declaration directly under a run or
            # a stand (it pays for the audit row's INSERT, docs/audit.md, Cost).
            owner = Record.objects.select_for_update(no_key=True).get(pk=owner.pk)
        else:
            _lock_tree(owner.tree_id)
            owner = Record.objects.get(pk=owner.pk)  # fresh tree columns, under the lock
        _owner_check_alive(owner)
        existing = Record.objects.filter(parent=owner, kind=kind, name=name).exclude(phase=Phase.DELETED).first()
        if existing is not None:
            record = _redeclare(existing, spec=spec, labels=labels, drift=drift, actor=actor)
            if protect and not record.protected:
                record = Record.objects.select_for_update(no_key=True).get(pk=record.pk)
                before = _audited(record)
                protected_declare(record, actor=actor)
                _audit("record.protect", record, actor=actor, before=before, after=_audited(record))
                _notify([record])
            return record
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
            **drift,
        )
        record.save(force_insert=True)  # mptt places it as the owner's last child
        Event.objects.create(
            **_event_kwargs(
                record.pk,
                EventType.DECLARED,
                reason="Declared",
                data={"owner": str(owner.pk), "generation": 1, **({"protected": True} if protect else {})},
                actor=actor,
                at=now,
            )
        )
        if protect:
            protected_event(record, actor=actor, declared=True)
        _audit("record.create", record, actor=actor, before=None, after=_audited(record), owner=owner.pk)
        _notify([record])
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
