"""Every write to records: declaration, phase transitions, convergence, cascade deletion,
TTL, transfer, drift, purge and the orphan sweep, one module each:

* ``transitions``: checked phase transitions and their events, locks, notifications;
* ``placement``: where an object lives, and the place it moved away from;
* ``declare``: validation, roots, declarations and re-declarations;
* ``converge``: adopt-or-create, retries, moves;
* ``delete``: cascade deletion, children first;
* ``ownership``: TTLs and transfers;
* ``protect``: protected records, where deletion stops until they are unprotected;
* ``drift``: observation, heal or report;
* ``housekeeping``: the reconciler, the tombstone purge, the orphan sweeper.

Rules kept here (see DESIGN.md, invariants I1-I4, I6):

* A record row is committed in phase ``pending`` before its kind touches the outside; its
  convergence is enqueued on commit (I1).
* Every phase change goes through ``_transition`` (``transitions``), which checks
  ``TRANSITIONS`` and writes a ``phase_changed`` event in the same transaction.
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

from apps.records.services.converge import (
    record_converge,
    record_wake,
)
from apps.records.services.declare import (
    drift_options_validate,
    kind_resolve,
    labels_validate,
    record_create_root,
    record_declare,
    record_ensure_root,
    run_root_rows,
    run_root_written,
    spec_validate,
)
from apps.records.services.delete import (
    DELETE_THREADS,
    record_delete_batch,
    record_delete_request,
    root_delete_request,
)
from apps.records.services.drift import (
    OBSERVE_SOON_FRACTION,
    OBSERVE_SOON_MIN,
    observe_interval,
    records_observe,
    records_observe_due,
)
from apps.records.services.housekeeping import (
    SWEEPER_NAME,
    records_purge,
    records_reconcile,
    records_sweep,
)
from apps.records.services.ownership import (
    NameTaken,
    record_extend,
    record_release,
    record_set_expiry,
    record_transfer,
    records_expire,
)
from apps.records.services.protect import (
    record_protect,
    record_unprotect,
)
from apps.records.services.transitions import (
    Actor,
    IllegalTransition,
    backoff_seconds,
    operation_lock,
    record_event_write,
    record_transition,
    records_group,
)

__all__ = [
    "DELETE_THREADS",
    "OBSERVE_SOON_FRACTION",
    "OBSERVE_SOON_MIN",
    "SWEEPER_NAME",
    "Actor",
    "IllegalTransition",
    "NameTaken",
    "backoff_seconds",
    "drift_options_validate",
    "kind_resolve",
    "labels_validate",
    "observe_interval",
    "operation_lock",
    "record_converge",
    "record_create_root",
    "record_declare",
    "record_delete_batch",
    "record_delete_request",
    "record_ensure_root",
    "record_event_write",
    "record_extend",
    "record_protect",
    "record_release",
    "record_set_expiry",
    "record_transfer",
    "record_transition",
    "record_unprotect",
    "record_wake",
    "records_expire",
    "records_group",
    "records_observe",
    "records_observe_due",
    "records_purge",
    "records_reconcile",
    "records_sweep",
    "root_delete_request",
    "run_root_rows",
    "run_root_written",
    "spec_validate",
]
