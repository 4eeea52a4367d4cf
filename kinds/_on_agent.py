"""Kinds whose objects live on an agent's machine: one ``call`` command per operation.

A kind's ``create``, ``observe`` and ``delete`` run in a worker; the object is on a machine
that only the agent reaches. ``run_on_agent`` stores a ``call`` command (a self-contained
function and its JSON arguments) for the record, waits a moment for the result, and
otherwise raises ``NotYet``: the command is a row, so it survives the worker, and when it
ends the record's convergence or deletion is woken (``waiting_record``) and takes the result
here, once (``command_take``). A crash after the command ran only repeats an idempotent
operation.

Lost machines. Creating waits while the agent is away for less than the grace period; after
that (the agent record turned ``drifted``) it fails and is retried with backoff like any
create. Deleting waits for the machine too, but never forever: once the agent has been gone
``GRAPHENE_AGENT_LOST_DELETE_DEADLINE_SECONDS`` past the deletion request (or at once if the
agent record itself is gone), the deletion is recorded as abandoned, with an event naming
what may be left on the machine, and the record is deleted.
"""

from __future__ import annotations

import inspect
import textwrap
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import cache
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.utils import timezone

from kinds import KindError, NotYet, PermanentError

if TYPE_CHECKING:
    from apps.agents.models import AgentCommand
    from apps.records.models import Record

# How long a worker waits for a command's result before it lets go (``NotYet``).
WAIT_SECONDS = 2.0
# How long an observation waits (a connected agent answers in milliseconds).
OBSERVE_WAIT_SECONDS = 5.0
# The retry asked for when the command's end does not wake the record (a lost hint).
RETRY_SECONDS = 10.0


class Abandoned(Exception):
    """The machine is gone for good: the object on it cannot be reached any more."""


@cache
def _source(fn: Callable[..., Any]) -> str:
    return textwrap.dedent(inspect.getsource(fn))


def agent_state(agent_id: str) -> tuple[Record | None, Any]:
    """The agent record (``None`` if it does not exist) and its connection state."""
    from apps.agents.models import Agent
    from apps.records.models import Record

    try:
        pk = uuid.UUID(str(agent_id))
    except ValueError:
        raise PermanentError(f"agent {agent_id!r} is not an agent record id (a UUID)") from None
    record = Record.objects.filter(pk=pk, kind="agent").first()
    state = Agent.objects.filter(pk=pk).first() if record is not None else None
    return record, state


def call_payload(fn: Callable[..., Any], args: list[Any]) -> dict[str, Any]:
    """The ``call`` command's payload that runs ``fn(*args)`` on the machine."""
    return {"source": _source(fn), "name": fn.__name__, "args": args, "kwargs": {}}


def _pending(record: Record, op: str) -> AgentCommand | None:
    """The newest command of ``op`` for ``record`` whose result nobody took yet."""
    from apps.agents.models import AgentCommand

    return (
        AgentCommand.objects.filter(
            waiting_record_id=record.pk,
            consumed_at__isnull=True,
            kind="call",
            operation=op,
        )
        .order_by("-created_at")
        .first()
    )


def _done_since_deletion(record: Record, op: str) -> AgentCommand | None:
    """A succeeded, taken command of ``op`` for ``record`` since its deletion was requested."""
    from apps.agents.models import AgentCommand

    if record.deletion_requested_at is None:
        return None
    return (
        AgentCommand.objects.filter(
            waiting_record_id=record.pk,
            consumed_at__isnull=False,
            status="succeeded",
            kind="call",
            operation=op,
            created_at__gte=record.deletion_requested_at,
        )
        .order_by("-created_at")
        .first()
    )


def wait_command(command: AgentCommand, seconds: float) -> AgentCommand | None:
    """The command once finished, or ``None`` after ``seconds``."""
    from apps.agents.models import AgentCommand

    started = time.monotonic()
    deadline = started + seconds
    pause = 0.005
    while True:
        current = AgentCommand.objects.filter(pk=command.pk).first()
        if current is None or current.is_finished:
            return current
        now = time.monotonic()
        if now >= deadline:
            return None
        time.sleep(min(pause, deadline - now))
        # Most commands end within a second (tens of ms): look often then, rarely after.
        pause = min(pause * 2, 0.02 if now - started < 1.0 else 0.1)


def _value(command: AgentCommand, what: str) -> Any:
    """The function's return value, or the error it raised on the machine as a ``KindError``."""
    result = command.result or {}
    if command.status == "succeeded":
        return result.get("value")
    detail = result.get("error_message") or command.error or command.status
    error_type = result.get("error_type") or ""
    if error_type in ("FileExistsError", "ValueError", "IsADirectoryError", "NotADirectoryError"):
        raise PermanentError(f"{what}: {detail}")
    raise KindError(f"{what}: {f'{error_type}: ' if error_type else ''}{detail}")


def run_on_agent(
    record: Record,
    agent_id: str,
    op: str,
    fn: Callable[..., Any],
    args: list[Any],
    *,
    deleting: bool = False,
    sealed: bool = False,
    wait: float = WAIT_SECONDS,
    in_process: bool = False,
) -> Any:
    """``fn(*args)`` on the agent's machine for ``record``'s ``op``: its value, ``NotYet`` while
    the command is under way, ``Abandoned`` (deleting only) when the machine is gone for good.
    ``sealed``: the arguments carry a secret's value (stored encrypted, see ``command_submit``).
    ``in_process``: ``fn`` is quick and bounded, so the agent may call it in its own process."""
    from apps.agents import services as agents
    from apps.core.errors import ValidationFailed

    agent, state = agent_state(agent_id)
    what = f"{op} on agent {agent.name if agent is not None else agent_id}"
    if not deleting:
        # A command sent for an earlier spec (still queued for an agent that was away) must not
        # answer for this one: what it wrote is not what the record now says.
        op = f"{op}@{record.generation}"
    command = _pending(record, op)
    if command is None and deleting:
        done = _done_since_deletion(record, op)
        if done is not None:  # a duplicate of a deletion that has just done it (a wake, a redelivery)
            return _value(done, what)
    if command is None:
        check_reachable(record, agent, state, what, deleting=deleting)
        assert agent is not None
        try:
            command = agents.command_submit(
                agent=agent,
                kind="call",
                payload=call_payload(fn, args),
                waiting_record=record.pk,
                operation=op,
                sealed=sealed,
                in_process=in_process,
            )
        except ValidationFailed as exc:  # too big for a command, say: no retry makes it fit
            raise PermanentError(f"{what}: {exc.detail}") from exc
        except Exception as exc:  # refused (being deleted meanwhile): decide again next time
            raise KindError(f"{what}: {getattr(exc, 'detail', exc)}") from exc
    finished = wait_command(command, wait)
    if finished is None:
        retry_in = RETRY_SECONDS
        if deleting:
            retry_in = min(retry_in, check_reachable(record, agent, state, what, deleting=True, pending=command))
        elif state is not None and state.lost_at is not None:
            raise KindError(f"{what}: {_lost(state)}")
        raise NotYet(f"{what}: waiting for the machine", retry_in=retry_in)
    agents.command_take(command=finished)
    return _value(finished, what)


def observe_on_agent(
    record: Record, agent_id: str, fn: Callable[..., Any], args: list[Any], *, in_process: bool = False
) -> Any:
    """``fn(*args)`` on the machine for ``record``'s observation: ``NotYet`` (no error, look
    again next interval) while the agent is not connected, since its own record says so."""
    _agent, state = agent_state(agent_id)
    if state is None or state.session is None:
        raise NotYet("the agent is not connected")
    return run_on_agent(record, agent_id, "observe", fn, args, wait=OBSERVE_WAIT_SECONDS, in_process=in_process)


def check_reachable(
    record: Record,
    agent: Record | None,
    state: Any,
    what: str,
    *,
    deleting: bool,
    pending: AgentCommand | None = None,
) -> float:
    """Raise if the machine cannot be asked now: ``Abandoned`` for a deletion past its
    deadline (cancelling the command left waiting), ``KindError`` for a lost agent.
    Returns the seconds left until a deletion's deadline (or ``RETRY_SECONDS``)."""
    from apps.agents import services as agents

    gone = agent is None or agent.phase in ("deleting", "deleted", "delete_failed")
    if deleting:
        deadline = timedelta(seconds=settings.GRAPHENE_AGENT_LOST_DELETE_DEADLINE_SECONDS)
        now = timezone.now()
        connected = state is not None and state.session is not None
        away_since = None if connected or state is None else state.disconnected_at
        requested = record.deletion_requested_at or now
        if gone or (away_since is not None and now - max(requested, away_since) >= deadline):
            if pending is not None:
                agents.command_cancel(command=pending)
            why = "its agent record is deleted" if gone else f"its agent has been away since {_when(away_since)}"
            raise Abandoned(f"{what}: {why}")
        if away_since is None:
            return RETRY_SECONDS
        left = (max(requested, away_since) + deadline - now).total_seconds()
        return max(0.5, left + 0.5)
    if gone:
        raise PermanentError(f"{what}: the agent record is deleted or being deleted")
    if state is not None and state.lost_at is not None:
        raise KindError(f"{what}: {_lost(state)}")
    return RETRY_SECONDS


def _when(at: Any) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S} UTC" if at is not None else "an unknown time"


def _lost(state: Any) -> str:
    return f"the agent is lost (no connection since {_when(state.disconnected_at)})"


def abandon(record: Record, error: Abandoned, *, left: str) -> None:
    """Record that the object on the machine was given up on (the record is deleted anyway)."""
    from apps.records import services as records

    records.record_event_write(
        record.pk,
        "error",
        reason="DeletionAbandoned",
        message=f"{error}; {left} may be left on the machine",
        data={"abandoned": True, "left": left},
    )
