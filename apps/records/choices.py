"""Record phases and the legal moves between them."""

from django.db import models


class Phase(models.TextChoices):
    # Committed, nothing touched outside yet (invariant I1); convergence is enqueued on commit.
    PENDING = "pending", "Pending"
    # The kind's create (adopt-or-create) is running or will be retried after a failure.
    CREATING = "creating", "Creating"
    # The external object exists and matched the spec when last observed.
    READY = "ready", "Ready"
    # Create gave up (a permanent error or retries exhausted); nothing is retried until asked.
    CREATE_FAILED = "create_failed", "Create failed"
    # Observation found the object differs from the spec, or is gone, and policy is to report.
    DRIFTED = "drifted", "Drifted"
    # A new generation of the spec is being applied to the existing object.
    UPDATING = "updating", "Updating"
    # Deletion was requested and the kind's delete is running (children are already gone).
    DELETING = "deleting", "Deleting"
    # The kind's delete failed; a retry with backoff is scheduled. Never dropped (I6).
    DELETE_FAILED = "delete_failed", "Delete failed"
    # Tombstone: the kind confirmed the object is gone. Kept, with its events, until purged.
    DELETED = "deleted", "Deleted"


TERMINAL = frozenset({Phase.DELETED})

# Phases in which the external object may exist and must be deleted before the record is gone.
LIVE = frozenset(set(Phase) - TERMINAL)

TRANSITIONS: dict[str, frozenset[str]] = {
    Phase.PENDING: frozenset({Phase.CREATING, Phase.DELETING}),
    Phase.CREATING: frozenset({Phase.CREATING, Phase.READY, Phase.CREATE_FAILED, Phase.DELETING}),
    Phase.READY: frozenset({Phase.DRIFTED, Phase.UPDATING, Phase.CREATING, Phase.DELETING}),
    Phase.CREATE_FAILED: frozenset({Phase.CREATING, Phase.DELETING}),
    Phase.DRIFTED: frozenset({Phase.READY, Phase.UPDATING, Phase.CREATING, Phase.DELETING}),
    Phase.UPDATING: frozenset({Phase.READY, Phase.CREATE_FAILED, Phase.DRIFTED, Phase.DELETING}),
    Phase.DELETING: frozenset({Phase.DELETED, Phase.DELETE_FAILED}),
    Phase.DELETE_FAILED: frozenset({Phase.DELETING}),
    Phase.DELETED: frozenset(),
}


class DriftPolicy(models.TextChoices):
    # Re-converge (the kind's adopt-or-create) and count the heal on the record.
    HEAL = "heal", "Heal"
    # Only record it: the record goes ``drifted`` until the object matches its spec again.
    REPORT = "report", "Report"


# Kinds that are roots of their own trees (I2): nothing owns them.
ROOT_KINDS = frozenset({"graphene.run", "graphene.stand", "graphene.sweeper"})


class EventType(models.TextChoices):
    # The record was declared (inserted in phase pending).
    DECLARED = "declared", "Declared"
    # The phase changed; ``data`` holds ``from`` and ``to``.
    PHASE_CHANGED = "phase_changed", "Phase changed"
    # A create or delete attempt failed; ``data`` holds the attempt number and next retry.
    ERROR = "error", "Error"
    # Deletion of the subtree rooted here was requested (by a user, an owner's death or TTL).
    DELETION_REQUESTED = "deletion_requested", "Deletion requested"
    # The deletion waits on a protected record (``data.protected``: its id): the record itself,
    # or one it owns (directly or below). Written once per record and protected record.
    DELETION_BLOCKED = "deletion_blocked", "Deletion blocked"
    # Protection was set (by a declaration's ``protect=True`` or a user) or removed.
    PROTECTED = "protected", "Protected"
    UNPROTECTED = "unprotected", "Unprotected"
    # The record was given to a new owner (event on the record and on both owners).
    TRANSFERRED_OUT = "transferred_out", "Transferred out"
    TRANSFERRED_IN = "transferred_in", "Transferred in"
    # The lifetime changed: extended, released (no TTL) or expired.
    TTL_CHANGED = "ttl_changed", "TTL changed"
    EXPIRED = "expired", "Expired"
    # The sweeper found an external object whose record is gone, and deleted it.
    ORPHAN_DELETED = "orphan_deleted", "Orphan deleted"
    ORPHAN_DELETE_FAILED = "orphan_delete_failed", "Orphan delete failed"
    # Observation found the object differs from its spec (data: the changed fields) or is gone.
    DRIFT_DETECTED = "drift_detected", "Drift detected"
    # The log bounds removed lines from the record's log (data: how many).
    LOGS_TRIMMED = "logs_trimmed", "Logs trimmed"
    # Something was done with or on the record that changes no phase (``reason`` says what:
    # a capability published on an agent, a terminal opened on its machine; ``data`` details).
    NOTE = "note", "Note"
    # A user opened or closed a terminal (PTY) on an agent's machine (data: session, user, exit code).
    TERMINAL = "terminal", "Terminal"
