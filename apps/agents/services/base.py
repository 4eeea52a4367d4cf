"""What the agents' services share: the record kind, the errors, the connection's group, and
the small helpers every subsystem writes with (the clock, events, conditions, refusals)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.utils import timezone

from apps.core import audit
from apps.core.errors import GrapheneError, ValidationFailed
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Record

AGENT_KIND = "agent"


class IllegalCommandTransition(GrapheneError):
    code = "illegal_transition"


class AgentRefused(GrapheneError):
    """The gateway refuses a connection; ``close_code`` is what the socket is closed with."""

    status_code = 403
    code = "agent_refused"

    def __init__(self, detail: str, *, close_code: int, reason: str) -> None:
        super().__init__(detail)
        self.close_code = close_code
        self.reason = reason


def agent_group(record_id: Any) -> str:
    """The Channels group of an agent's connection (hints only: the rows are the truth)."""
    return f"agent.{record_id}"


def _now() -> datetime:
    return timezone.now()


def _record_event(record_id: Any, type: str, *, reason: str, message: str, data: dict[str, Any] | None = None) -> None:
    records.record_event_write(record_id, type, reason=reason, message=message, data=data)


def _audit(
    action: str,
    agent: Record,
    *,
    actor: Any,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    object_id: Any = None,
    object_name: str = "",
    **detail: Any,
) -> None:
    """The audit row of a write to an agent (or, with ``object_id``, to one of its commands),
    in the caller's transaction."""
    audit.audit_write(
        action=action,
        resource="agents",
        object_id=object_id if object_id is not None else agent.pk,
        object_name=object_name or agent.name,
        namespace=agent.namespace,
        before=before,
        after=after,
        detail=detail,
        actor=actor,
    )


def _set_condition(
    conditions: Sequence[Mapping[str, Any]], type: str, status: bool, *, reason: str, message: str
) -> list[dict[str, Any]]:
    """Kubernetes-style conditions: one entry per type; the time moves only when the status does."""
    now = _now().isoformat()
    value = "True" if status else "False"

    def entry(since: Any) -> dict[str, Any]:
        return {"type": type, "status": value, "reason": reason, "message": message, "last_transition_at": since}

    out: list[dict[str, Any]] = []
    found = False
    for condition in conditions:
        if condition.get("type") != type:
            out.append(dict(condition))
            continue
        found = True
        changed = condition.get("status") != value
        out.append(entry(now if changed else condition.get("last_transition_at", now)))
    if not found:
        out.append(entry(now))
    return out


def _fail(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(f"{field}: {message}", fields={field: [message]})


def _retired(record: Record) -> bool:
    """The agent record itself is being deleted (its tokens are revoked, it takes no commands).

    A requested deletion alone does not retire it: records on its machine (its children)
    are deleted first, through it, so it keeps serving until its own turn comes.
    """
    return record.phase in (Phase.DELETING, Phase.DELETED, Phase.DELETE_FAILED)
