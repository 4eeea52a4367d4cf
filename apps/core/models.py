"""Abstract bases shared by Graphene's models."""

from django.db import models


class TimeStampedModel(models.Model):
    """``created_at``/``updated_at`` kept by the database layer, always timezone-aware."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class Namespace(models.Model):
    """A boundary a team owns: every record, run, pipeline, stand, secret, agent and artifact
    lives in exactly one, and nothing crosses it. ``default`` exists from the first migration
    (a one-team installation never names another)."""

    name = models.CharField(max_length=63, unique=True)
    description = models.CharField(max_length=400, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Role(models.Model):
    """A named set of additive rules. Each rule is ``{"verbs": [...], "resources": [...]}``; ``*``
    matches any verb or resource. Built-in roles (admin, developer, viewer, agent-installer) are
    made by a migration and cannot be changed through the API."""

    name = models.CharField(max_length=63, unique=True)
    description = models.CharField(max_length=400, blank=True)
    rules = models.JSONField(default=list)
    is_builtin = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class RoleBinding(models.Model):
    """Grants a role's rules to a user (service accounts are users) or a group, in one namespace,
    or in every namespace when ``namespace`` is ``*``."""

    role = models.ForeignKey(Role, on_delete=models.PROTECT, related_name="bindings")
    namespace = models.CharField(max_length=63, db_index=True)
    user = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.CASCADE, related_name="role_bindings")
    group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.CASCADE, related_name="role_bindings"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["namespace", "id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(user__isnull=False, group__isnull=True)
                | models.Q(user__isnull=True, group__isnull=False),
                name="rolebinding_one_subject",
            ),
            models.UniqueConstraint(fields=["role", "namespace", "user"], name="rolebinding_user_unique"),
            models.UniqueConstraint(fields=["role", "namespace", "group"], name="rolebinding_group_unique"),
        ]

    def __str__(self) -> str:
        subject = f"user {self.user_id}" if self.user_id else f"group {self.group_id}"
        return f"{subject} is {self.role_id} in {self.namespace}"


class AuditActorKind(models.TextChoices):
    """Who made a change."""

    # A person or a service account (service accounts are users), signed in through REST or the Studio.
    USER = "user"
    # A pipeline run's code (its declarations, deletions, hand-overs, commands).
    RUN = "run"
    # An agent, for what it reports about its machine.
    AGENT = "agent"
    # Graphene itself: beat's periodic tasks (TTL expiry, sweeps), the reconciler, housekeeping.
    SYSTEM = "system"


class AuditEntry(models.Model):
    """One write, as the audit trail keeps it: who, what, on which object, in which namespace,
    under which request, and digests of the object before and after (never values of secrets).

    Append-only: on PostgreSQL a trigger refuses every UPDATE, and every DELETE but the
    retention task's (migration ``0003_audit_trail``). No foreign keys on purpose: deleting a
    user, a record or a namespace must neither cascade into the trail nor update it (an
    ``ON DELETE SET NULL`` would be an UPDATE, which the trigger refuses); names and ids are
    copied in as they were.
    """

    id = models.BigAutoField(primary_key=True)
    created_at = models.DateTimeField()
    actor_kind = models.CharField(max_length=8, choices=AuditActorKind.choices)
    # The user's primary key, the run's or the agent's record id; empty for the system.
    actor_id = models.CharField(max_length=64, blank=True)
    # The username, "pipeline#n", the agent's name, or what in Graphene acted ("records-expire").
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=40)  # "record.create", "run.cancel", "secret.set", ...
    resource = models.CharField(max_length=20)  # the access module's resource: records, runs, ...
    object_id = models.CharField(max_length=64)
    object_name = models.CharField(max_length=253, blank=True)
    # The object's namespace; "*" for installation-wide objects (namespaces, roles, bindings in *).
    namespace = models.CharField(max_length=63)
    # The HTTP request that made the change (X-Request-Id); empty outside a request.
    request_id = models.CharField(max_length=64, blank=True)
    # sha256 of a canonical JSON of the object's fields that matter; null where there is no
    # object: before a create, after a delete ("" would read as a digest of something).
    before_digest = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001 - see above
    after_digest = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001 - see above
    # A little context that is not a secret: a reason, an owner, how many records a delete covers.
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [
            # Newest first (the API's cursor pages, the Studio's list) and the retention's range.
            models.Index(fields=["created_at", "id"], name="audit_created"),
            # An object's history (the record inspector's and the run page's link, ?object=).
            models.Index(fields=["object_id", "created_at"], name="audit_object"),
            # One request's rows (?request_id=); rows written outside a request are not in it.
            models.Index(fields=["request_id"], name="audit_request", condition=~models.Q(request_id="")),
        ]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_kind}:{self.actor_name} {self.action} {self.object_id}"


class WorkerHeartbeat(models.Model):
    """A worker process that executes tasks, proving it is alive (``apps.core.workers``).

    A thread of the process refreshes ``beat_at`` every ``GRAPHENE_WORKER_HEARTBEAT_SECONDS``
    over a database session of its own, named by ``session_pid``/``session_started_at``. Another
    worker marks it lost (``lost_at``) when that session has ended (the process died: its
    connection closed) or when it stopped beating for ``GRAPHENE_WORKER_LOST_SECONDS``; what it
    held (records' operations, runs' leases) is then taken over at once.
    """

    id = models.UUIDField(primary_key=True)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField()
    # The heartbeat's PostgreSQL session (pg_backend_pid() and its backend_start).
    session_pid = models.PositiveIntegerField(null=True, blank=True)
    session_started_at = models.DateTimeField(null=True, blank=True)
    lost_at = models.DateTimeField(null=True, blank=True)
    lost_reason = models.CharField(max_length=200, blank=True)

    # No index but the key: one row per worker process, and a beat every second must stay a
    # heap-only update (an indexed beat_at would add an index entry each time).

    def __str__(self) -> str:
        return f"{self.hostname} (pid {self.pid})"


class HeldLease(models.Model):
    """Which worker holds a lease token (a run's execution lease): when the worker is lost, the
    lease's owner (the pipelines app) takes the lease over without waiting for it to expire."""

    token = models.UUIDField(primary_key=True)
    # Not a foreign key: a lease is taken in its owner's transaction, which must not fail
    # because the heartbeat row is being replaced; rows go with their lost worker's.
    worker_id = models.UUIDField(db_index=True)
    subject = models.CharField(max_length=80)  # what the lease is on ("run <id>"), for people
    taken_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.subject} held by {self.worker_id}"
