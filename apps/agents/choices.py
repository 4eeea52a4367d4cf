"""Command statuses and the legal moves between them; token kinds; delivery guarantees."""

from django.db import models
from graphene_agent import protocol


class CommandStatus(models.TextChoices):
    # Stored; not yet written to a connection of the agent (it may not be connected).
    QUEUED = "queued", "Queued"
    # Written to the agent's connection, not yet acknowledged; re-sent after a reconnect.
    SENT = "sent", "Sent"
    # The agent acknowledged it and is running it (re-attached after a reconnect).
    RUNNING = "running", "Running"
    # Done: exit status 0 (exec), the file written or read (put_file, get_file).
    SUCCEEDED = "succeeded", "Succeeded"
    # Done and not successful: a non-zero exit status, a timeout, or it could not start.
    FAILED = "failed", "Failed"
    # Cancelled before it started, or its process group was killed on the agent.
    CANCELLED = "cancelled", "Cancelled"
    # At most once, and the agent vanished mid-flight: it may or may not have run. Never re-sent.
    UNKNOWN = "unknown", "Outcome unknown"


TERMINAL = frozenset({CommandStatus.SUCCEEDED, CommandStatus.FAILED, CommandStatus.CANCELLED, CommandStatus.UNKNOWN})
OPEN = frozenset({CommandStatus.QUEUED, CommandStatus.SENT, CommandStatus.RUNNING})
# Sent to a connection at least once: the agent may have it.
IN_FLIGHT = frozenset({CommandStatus.SENT, CommandStatus.RUNNING})

TRANSITIONS: dict[str, frozenset[str]] = {
    CommandStatus.QUEUED: frozenset({CommandStatus.SENT, CommandStatus.CANCELLED}),
    # A fast command's result (or a replayed one) may arrive without a separate "accepted".
    CommandStatus.SENT: frozenset({CommandStatus.SENT, CommandStatus.RUNNING, *TERMINAL}),
    CommandStatus.RUNNING: frozenset({CommandStatus.RUNNING, *TERMINAL}),
    CommandStatus.SUCCEEDED: frozenset(),
    CommandStatus.FAILED: frozenset(),
    CommandStatus.CANCELLED: frozenset(),
    CommandStatus.UNKNOWN: frozenset(),
}


class CommandKind(models.TextChoices):
    # Run argv with env and cwd; stdout/stderr stream into the agent record's log.
    EXEC = protocol.EXEC, "exec"
    # Write a file (base64 data, mode) atomically.
    PUT_FILE = protocol.PUT_FILE, "put_file"
    # Read a file (up to 512 KiB) into the result.
    GET_FILE = protocol.GET_FILE, "get_file"
    # Run a Python function (its source, JSON arguments) on the machine; its JSON result.
    CALL = protocol.CALL, "call"


class Guarantee(models.TextChoices):
    # Re-sent until a result arrives; the agent de-duplicates, and re-runs it only if a
    # restart of the agent interrupted it.
    AT_LEAST_ONCE = protocol.AT_LEAST_ONCE, "At least once"
    # Never run twice: if the agent vanished while it was in flight, the outcome is ``unknown``.
    AT_MOST_ONCE = protocol.AT_MOST_ONCE, "At most once"


class TokenKind(models.TextChoices):
    # Single-use, short-lived; exchanged at the first connect for a credential.
    BOOTSTRAP = "bootstrap", "Bootstrap token"
    # Long-lived; what the agent presents on every later connect.
    CREDENTIAL = "credential", "Credential"
