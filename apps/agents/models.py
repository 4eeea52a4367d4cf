"""Agents: the gateway's state of each agent record, its tokens, and the commands sent to it.

The agent itself is a record of kind ``agent`` (its phase, labels, facts in ``outputs``,
conditions and events live there); these tables hold what the gateway needs besides.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from apps.agents.choices import OPEN, CommandKind, CommandStatus, Guarantee, TokenKind
from apps.records.models import Record


class Agent(models.Model):
    """Connection state of one agent record: which connection is current, and when it was seen.

    ``session`` fences the gateway: every write a connection makes checks that it is still the
    current one, so a stale connection (superseded, or closed while a newer one opened) cannot
    mark a connected agent as gone.
    """

    record = models.OneToOneField(Record, primary_key=True, on_delete=models.CASCADE, related_name="agent_state")
    session = models.UUIDField(null=True, blank=True, help_text="the current connection; empty while disconnected")
    channel_name = models.CharField(max_length=255, blank=True)
    instance = models.CharField(max_length=64, blank=True, help_text="the agent process (changes on restart)")
    version = models.CharField(max_length=40, blank=True)
    peer = models.CharField(max_length=100, blank=True, help_text="the address the connection came from")
    connected_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    disconnected_at = models.DateTimeField(null=True, blank=True)
    # Set when a disconnection outlived the grace period (the record turned drifted).
    lost_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["disconnected_at"],
                name="agent_disconnected",
                condition=Q(session__isnull=True, lost_at__isnull=True, disconnected_at__isnull=False),
            )
        ]
        permissions = [("open_terminal", "Can open a terminal (PTY) on an agent's machine")]

    def __str__(self) -> str:
        return f"agent {self.record_id} ({'connected' if self.is_connected else 'disconnected'})"

    @property
    def is_connected(self) -> bool:
        return self.session is not None


class AgentToken(models.Model):
    """A bootstrap token or a credential of one agent. Only the SHA-256 of the secret is stored."""

    id = models.BigAutoField(primary_key=True)
    agent = models.ForeignKey(Record, on_delete=models.CASCADE, related_name="agent_tokens")
    kind = models.CharField(max_length=20, choices=TokenKind.choices)
    # Tokens are 256-bit random values, so a plain SHA-256 is as good as a slow hash here,
    # and an indexed lookup needs no per-row salt.
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16, help_text="the first characters, to tell tokens apart")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True)
    used_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_reason = models.CharField(max_length=120, blank=True)

    class Meta:
        indexes = [models.Index(fields=["agent", "kind"], name="agenttoken_agent_kind")]

    def __str__(self) -> str:
        return f"{self.kind} {self.prefix}… of {self.agent_id}"


class AgentCommand(models.Model):
    """One command for an agent. Stored before it is sent; the row is the truth, the socket is delivery."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(Record, on_delete=models.CASCADE, related_name="agent_commands")
    kind = models.CharField(max_length=20, choices=CommandKind.choices)
    payload = models.JSONField(default=dict, blank=True)
    guarantee = models.CharField(max_length=20, choices=Guarantee.choices, default=Guarantee.AT_LEAST_ONCE)
    status = models.CharField(max_length=20, choices=CommandStatus.choices, default=CommandStatus.QUEUED)
    exit_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    stdout_tail = models.TextField(blank=True)
    stderr_tail = models.TextField(blank=True)
    # The rest of the agent's answer: signal, timed_out, duration_s, size, sha256, data (get_file).
    result = models.JSONField(default=dict, blank=True)
    # The last output chunk stored: a chunk re-sent after a reconnect is stored once.
    output_seq = models.PositiveBigIntegerField(default=0)
    deliveries = models.PositiveIntegerField(default=0)
    session = models.UUIDField(null=True, blank=True, help_text="the connection it was last sent on")
    # Other records whose logs also receive the output (e.g. the run that asked for it).
    log_record_ids = models.JSONField(default=list, blank=True)
    # A record whose convergence or deletion waits on this command (a file on the agent's
    # machine): when the command ends, that record's work is enqueued again.
    waiting_record_id = models.UUIDField(null=True, blank=True)
    # What that record's kind asked for (e.g. write, observe, remove), to find it again.
    operation = models.CharField(max_length=40, blank=True, default="")
    # When that record's kind took the result (a result is used once; see apps/agents/machine.py).
    consumed_at = models.DateTimeField(null=True, blank=True)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["agent", "-created_at"], name="agentcommand_agent_created"),
            # Delivery and the lost-agent sweep read only the open commands of an agent.
            models.Index(
                fields=["agent", "created_at"], name="agentcommand_open", condition=Q(status__in=sorted(OPEN))
            ),
            # The commands a record's convergence or deletion waits on, not yet taken.
            models.Index(
                fields=["waiting_record_id", "created_at"],
                name="agentcommand_waiting",
                condition=Q(waiting_record_id__isnull=False, consumed_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status not in OPEN


class AgentCapability(models.Model):
    """Something an agent's machine offers (``docker`` 24 with ``arch=amd64``), published by a run.

    Pipelines find machines by what they offer: ``need(name, where_label=..., where_in=...)``
    in ``ctx.attach_agent`` and ``ctx.select_agents`` matches these rows. One row per agent
    and name: publishing again replaces the version and labels.
    """

    id = models.BigAutoField(primary_key=True)
    agent = models.ForeignKey(Record, on_delete=models.CASCADE, related_name="agent_capabilities")
    name = models.CharField(max_length=100)
    version = models.CharField(max_length=100, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    published_at = models.DateTimeField()
    # The run (its record) that published it, if a run did.
    published_by = models.UUIDField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["agent", "name"], name="agentcapability_agent_name")]
        indexes = [models.Index(fields=["name"], name="agentcapability_name")]

    def __str__(self) -> str:
        return f"{self.name} {self.version} on {self.agent_id}".replace("  ", " ")
