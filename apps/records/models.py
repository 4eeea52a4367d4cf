"""Records: the durable account of everything Graphene creates, as ownership trees."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from mptt.managers import TreeManager
from mptt.models import MPTTModel, TreeForeignKey

from apps.core.db import is_postgresql, sequence_next
from apps.core.domain import RecordRef
from apps.core.models import TimeStampedModel
from apps.records.choices import ROOT_KINDS, DriftPolicy, EventType, Phase


class RecordManager(TreeManager, models.Manager["Record"]):  # typed as a Manager: mptt ships no type hints
    """mptt's tree manager, numbering new trees without a lock.

    mptt numbers a new root's tree ``max(tree_id) + 1``, which two transactions creating roots
    at once both compute alike (two roots in one tree), so every root creation had to wait for
    the previous one to commit. On PostgreSQL a sequence numbers them instead; on SQLite the
    write lock every write transaction takes serializes them already.
    """

    def _get_next_tree_id(self) -> int:
        if not is_postgresql(self.db):
            return int(super()._get_next_tree_id())
        return sequence_next(TREE_ID_SEQUENCE, taken="SELECT MAX(tree_id) FROM records_record")


# The sequence of tree ids (apps.core.db.sequence_next): whatever writes trees by other means
# (a bulk load) must move it past the ids it used.
TREE_ID_SEQUENCE = "records_record_tree_id"


class Record(MPTTModel, TimeStampedModel):
    """One resource (or a run, stand or sweeper, which are the roots) and its lifecycle.

    The tree is the ownership: ``parent`` is the one owner. Each root owns a separate mptt
    tree (its own ``tree_id``), so inserting into one run's tree never shifts rows of another
    tree and the cost of a declaration does not grow with the installation.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=200)
    name = models.CharField(max_length=253)
    namespace = models.CharField(max_length=63, default="default")
    spec = models.JSONField(default=dict, blank=True)
    outputs = models.JSONField(default=dict, blank=True)
    # The spec of the place the object was moved away from (its kind's ``placement`` changed)
    # until the object there is removed; null when it is not moving.
    moved_from = models.JSONField(null=True, blank=True)
    phase = models.CharField(max_length=20, choices=Phase.choices, default=Phase.PENDING)
    conditions = models.JSONField(default=list, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    # The owner. CASCADE only serves the tombstone purge; the domain deletes through phases.
    parent = TreeForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="children")
    created_by_run = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_constraint=False
    )
    expires_at = models.DateTimeField(null=True, blank=True)
    deletion_requested_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    generation = models.PositiveIntegerField(default=1)
    observed_generation = models.PositiveIntegerField(default=0)
    # Consecutive failed attempts of the current operation, for backoff; reset on success.
    attempts = models.PositiveIntegerField(default=0)
    # When the reconciler should look at this record again if no task did (lost message).
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # The worker process running this record's convergence or deletion now (its heartbeat's
    # id, apps/core/workers.py); null between operations and outside workers. A lost worker's
    # operations are taken over at once (services.housekeeping.records_take_over).
    held_by = models.UUIDField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    # Drift: what to do when observation finds the object differs from its spec or is gone.
    drift_policy = models.CharField(max_length=8, choices=DriftPolicy.choices, default=DriftPolicy.HEAL)
    # Seconds between observations (``reconcile_every=``); null: the kind's ``drift_interval``.
    observe_every = models.PositiveIntegerField(null=True, blank=True)
    # When the drift scheduler observes this record next; null: not observed (not ready, or its
    # kind has no drift check).
    next_observe_at = models.DateTimeField(null=True, blank=True)
    observed_at = models.DateTimeField(null=True, blank=True)
    # Heals done (re-convergences after drift), and whether one is in flight.
    heals = models.PositiveIntegerField(default=0)
    healing = models.BooleanField(default=False)
    # Protection: deletion stops here (the record and what it owns stay, its owners wait in
    # their deletion) until it is unprotected. Who set it, as the audit trail names actors
    # (``user:alice``, ``run:deploy#4``), and when; both empty while unprotected.
    protected = models.BooleanField(default=False)
    protected_by = models.CharField(max_length=200, blank=True)
    protected_at = models.DateTimeField(null=True, blank=True)
    # Free numbers at the right end of the record's bounds (``rght - tree_slack`` up to ``rght
    # - 1``, after its last child): room for children declared later without moving any other
    # record. A declaration into a full owner grows it by its own width (at least 64), so an
    # owner of n children moves the records to its right about log2(n) times, not n times
    # (services/declare.py). Relative to ``rght``, so mptt's moves and gap closing, which shift
    # a record's bounds with the numbers before them, leave it true; only mptt's insert as an
    # owner's last child lands after the free numbers, and resets it (services/ownership.py).
    # Nested sets with free numbers are not dense: see ``descendants_counted``.
    tree_slack = models.PositiveIntegerField(default=0, db_default=0)
    # Not indexed alone: ``record_created`` (created_at, id) answers every query by creation
    # time, and each index is one more entry written by every insert and by every update that
    # is not HOT: a deletion updates each record three times (bench/cascade_delete.py).
    created_at = models.DateTimeField(auto_now_add=True)

    objects = RecordManager()

    # mptt's ``get_descendant_count`` is ``(rght - lft - 1) // 2``: with free numbers in the
    # bounds (``tree_slack``) that is half the record's width, not its count, and mptt itself
    # uses it as the width when it moves a subtree, so it stays as it is; ``descendants_counted``
    # counts. ``is_leaf_node`` is exact: bounds that hold only free numbers own nothing.

    def descendants_counted(self) -> int:
        """The records this one owns, directly or below (deleted ones not yet purged included)."""
        return int(Record.objects.filter(tree_id=self.tree_id, lft__gt=self.lft, rght__lt=self.rght).count())

    def is_leaf_node(self) -> bool:
        if self.rght - self.lft == 1:
            return True
        return not Record.objects.filter(parent_id=self.pk).exists()

    class MPTTMeta:
        order_insertion_by: list[str] = []

    class Meta:
        indexes = [
            # Newest-first lists narrowed to the namespaces a user may read (apps/core/access.py).
            models.Index(fields=["namespace", "created_at", "id"], name="record_namespace_newest"),
            # No index holds ``lft`` or ``rght``: a declaration moves the bounds of the records to
            # the right of its owner, and with no index on them those updates are HOT (no new
            # index entries per moved row; measured: a declaration nested under a run's branch
            # went from ~15 ms to ~2 ms, bench/records_insert.py). Ranges of a tree are read
            # through ``tree_id`` (a tree's rows; a run's tree is a few thousand at most).
            # A tree's root (its lock, ``_lock_tree``): one entry per tree.
            models.Index(fields=["tree_id"], name="record_root", condition=Q(parent__isnull=True)),
            models.Index(fields=["kind", "phase"], name="record_kind_phase"),
            # Newest first, ties broken by id (the API's cursor pages, the Studio's lists): the
            # index gives that order, so a filtered page stops after its rows, ties or not.
            models.Index(fields=["created_at", "id"], name="record_created"),
            # TTL sweep: only live records with a deadline are in this index.
            models.Index(
                fields=["expires_at"],
                name="record_expiring",
                condition=Q(expires_at__isnull=False) & Q(deletion_requested_at__isnull=True),
            ),
            # Reconciler: records whose work is due (retries, lost messages).
            models.Index(fields=["next_attempt_at"], name="record_due", condition=Q(next_attempt_at__isnull=False)),
            # Takeover: the operations a lost worker held.
            models.Index(fields=["held_by"], name="record_held", condition=Q(held_by__isnull=False)),
            # Drift scheduler: only records it observes are in this index.
            models.Index(
                fields=["next_observe_at"], name="record_observe_due", condition=Q(next_observe_at__isnull=False)
            ),
            # Tombstone purge.
            models.Index(fields=["deleted_at"], name="record_tombstone", condition=Q(deleted_at__isnull=False)),
            # Deletion asks whether a protected record holds a row (one at or above it in its
            # tree): only the few protected records are in this index.
            models.Index(fields=["tree_id"], name="record_protected_in_tree", condition=Q(protected=True)),
            # A declaration asks whether its owner has a child of that kind and name still being
            # deleted (record_unique_live_child answers for the others): the few such are here.
            models.Index(
                fields=["parent", "kind", "name"],
                name="record_child_deleting",
                condition=~Q(phase=Phase.DELETED) & Q(deletion_requested_at__isnull=False),
            ),
        ]
        constraints = [
            # One live record per (owner, kind, name): a re-declaration adopts the existing one.
            # A record whose deletion was requested gives its name up (a stand holding replaced
            # by a newer one is still being deleted while the newer one holds the name).
            models.UniqueConstraint(
                fields=["parent", "kind", "name"],
                condition=~Q(phase=Phase.DELETED) & Q(parent__isnull=False) & Q(deletion_requested_at__isnull=True),
                name="record_unique_live_child",
            ),
            models.UniqueConstraint(
                fields=["kind", "namespace", "name"],
                condition=~Q(phase=Phase.DELETED) & Q(parent__isnull=True) & ~Q(kind="graphene.run"),
                name="record_unique_live_root",
            ),
            models.CheckConstraint(
                condition=Q(parent__isnull=False) | Q(kind__in=sorted(ROOT_KINDS)),
                name="record_owner_required",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"

    def clean(self) -> None:
        if self.parent_id is None and self.kind not in ROOT_KINDS:
            raise ValidationError({"parent": f"a {self.kind} record needs an owner"})
        if self.parent_id is not None and self.kind in ROOT_KINDS:
            raise ValidationError({"parent": f"{self.kind} records are roots and cannot be owned"})

    @property
    def is_root(self) -> bool:
        return self.parent_id is None

    def ref(self) -> RecordRef:
        """This record as domain events carry it: a snapshot of what subscribers may read."""
        run_root = self.created_by_run_id or (self.pk if self.kind == "graphene.run" else None)
        return RecordRef(
            id=str(self.pk),
            kind=self.kind,
            name=self.name,
            run_root_id=str(run_root) if run_root is not None else None,
            generation=self.generation,
            attempts=self.attempts,
            created_at=self.created_at,
            deletion_requested_at=self.deletion_requested_at,
        )


class Event(models.Model):
    """Append-only history of a record: phase changes, errors, transfers, user actions."""

    id = models.BigAutoField(primary_key=True)
    # No index of its own: ``event_record_id`` (record, id) serves every look-up by record, and
    # each event written would update both.
    record = models.ForeignKey(Record, on_delete=models.CASCADE, related_name="events", db_index=False)
    type = models.CharField(max_length=40, choices=EventType.choices)
    reason = models.CharField(max_length=80, blank=True)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(db_index=True)

    class Meta:
        indexes = [models.Index(fields=["record", "id"], name="event_record_id")]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.type} {self.reason}"


# django-mptt gives every tree model without one an index on (tree_id, lft) when the class is
# made (``MPTTModelBase.register``). Records must not have it: see ``Meta.indexes`` (the moved
# bounds of a declaration are HOT updates only while no index holds them).
Record._meta.indexes = [index for index in Record._meta.indexes if tuple(index.fields) != ("tree_id", "lft")]
