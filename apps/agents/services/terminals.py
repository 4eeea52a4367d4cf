"""Terminals: a terminal (PTY session) is live only: nothing of it is stored but its trail.

These write the events that say who opened a shell on the machine, when, and how it ended
(never what was typed or shown). The gateway's consumers call them; the relay itself is in
``consumers``.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from apps.agents.services.base import _audit
from apps.core import audit
from apps.core.models import AuditActorKind
from apps.records import services as records
from apps.records.choices import EventType
from apps.records.models import Record


def _user(user_id: Any) -> Any:
    from django.contrib.auth import get_user_model

    return get_user_model().objects.filter(pk=user_id).first() if user_id is not None else None


def terminal_refused(*, record_id: Any, user: records.Actor, why: str, message: str) -> None:
    """A user was refused a terminal (no permission, agent not connected): an ``error`` event."""
    username = user.get_username() if user is not None and user.is_authenticated else ""
    records.record_event_write(
        record_id,
        EventType.ERROR,
        reason="TerminalRefused",
        message=message,
        data={"user": username, "why": why},
        actor=user,
    )


def terminal_opened(
    *, record_id: Any, session: str, user_id: Any, username: str, pid: int, argv: list[str], cols: int, rows: int
) -> None:
    """The agent started the terminal's program: an event, and an ``agent.terminal_open`` row in
    the audit trail, whose actor is the user (the gateway's context names the agent)."""
    user = _user(user_id)
    with transaction.atomic():
        records.record_event_write(
            record_id,
            EventType.TERMINAL,
            reason="TerminalOpened",
            message=f"{username} opened a terminal: {' '.join(argv)} (pid {pid})",
            data={"session": session, "user": username, "pid": pid, "argv": argv, "cols": cols, "rows": rows},
            actor=user,
        )
        agent = Record.objects.filter(pk=record_id).first()
        if agent is not None:
            _audit(
                "agent.terminal_open",
                agent,
                actor=user if user is not None else audit.Who(AuditActorKind.USER, str(user_id or ""), username),
                session=session,
                argv=argv,
            )


def terminal_closed(
    *,
    record_id: Any,
    session: str,
    user_id: Any,
    username: str,
    exit_code: int | None,
    signal: int | None,
    duration_s: float,
    error: str = "",
    closed_by: str = "",
) -> None:
    """The terminal ended: its program exited (``exit_code``), or it did not start or its agent
    went away (``error``)."""
    if error:
        how = f"ended: {error}"
    elif signal:
        how = f"ended: killed by signal {signal} (exit code {exit_code})"
    else:
        how = f"ended with exit code {exit_code}"
    records.record_event_write(
        record_id,
        EventType.TERMINAL,
        reason="TerminalClosed",
        message=f"the terminal of {username} {how} after {duration_s:.1f}s",
        data={
            "session": session,
            "user": username,
            "exit_code": exit_code,
            "signal": signal,
            "duration_s": round(duration_s, 3),
            "error": error,
            "closed_by": closed_by,
        },
        actor=_user(user_id),
    )
