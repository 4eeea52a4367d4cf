"""The agents app's side of ``kinds.machine``: a kind's call on a machine as ``call`` commands.

A kind's ``create``, ``observe`` and ``delete`` run in a worker; the object is on a machine
that only the agent reaches. ``AgentMachines.run`` stores a ``call`` command (the function's
source and JSON arguments) for the record (``waiting_record``) and its operation, waits a
moment for the result, and otherwise raises ``NotYet``: the command is a row, so it survives
the worker, and when it ends the record's convergence or deletion is woken and takes the
result here, once (``command_take``). A crash after the command ran only repeats an
idempotent operation.

``request`` is the in-place form. A call the agent may run in its own process
(``in_process``) goes as a live call over the agent's connection (``apps.agents.live``: no
row, a few milliseconds of its own) where the channel layer reaches the gateway and the
agent offers them; otherwise as a command (operation ``sync:<op>``, which wakes nobody) whose
row the worker polls. Either way the wait checks every ``CHECK_SECONDS`` that the agent is
still connected, and stops the operation if it left (the command is cancelled) or the
timeout passed.

Lost machines (``_check_reachable``). Creating waits while the agent is away for less than
the grace period; after that (``lost_at`` set, the agent record turned ``drifted``) it fails
and is retried with backoff like any create. Deleting waits for the machine too, but never
forever: once the agent has been gone ``GRAPHENE_AGENT_LOST_DELETE_DEADLINE_SECONDS`` past
the deletion request (or at once if the agent record itself is gone), ``Abandoned`` is
raised and the kind records it with ``abandon``: an event naming what may be left on the
machine; the record is deleted.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.agents import live
from apps.agents import services as agents
from apps.agents.choices import CommandKind, CommandStatus
from apps.agents.models import Agent, AgentCommand
from apps.core.errors import ValidationFailed
from apps.records import services as records
from apps.records.choices import EventType, Phase
from apps.records.models import Record
from kinds import KindError, NotYet, PermanentError
from kinds.machine import PERMANENT_ERROR_TYPES, WAIT_SECONDS, Abandoned, Call, Purpose

# How long an observation waits (a connected agent answers in milliseconds).
OBSERVE_WAIT_SECONDS = 5.0
# The retry asked for when the command's end does not wake the record (a lost hint).
RETRY_SECONDS = 10.0
# What the agent's round trip may add to a request's own timeout before the wait stops.
MARGIN_SECONDS = 30.0
# How often a request's wait checks that the agent is still connected.
CHECK_SECONDS = 1.0
# A request while the agent is away: when to try the create again (no attempt is counted).
AWAY_RETRY_SECONDS = 3.0

# An agent record in one of these phases takes no more work for its machine.
_GONE = frozenset({Phase.DELETING, Phase.DELETED, Phase.DELETE_FAILED})


class AgentMachines:
    """``kinds.machine.Machines`` on agents' ``call`` commands (installed by ``AgentsConfig.ready``)."""

    def run(
        self, record: Record, agent_id: str, op: str, call: Call, *, deleting: bool = False, wait: float = WAIT_SECONDS
    ) -> Any:
        agent, state = _agent_and_state(agent_id)
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
            _check_reachable(record, agent, state, what, deleting=deleting)
            assert agent is not None
            command = _submit(agent, record, op, call, call.payload(), what)
        finished = _wait(command, wait)
        if finished is None:
            retry_in = RETRY_SECONDS
            if deleting:
                retry_in = min(retry_in, _check_reachable(record, agent, state, what, deleting=True, pending=command))
            elif state is not None and state.lost_at is not None:
                raise KindError(f"{what}: {_lost(state)}")
            raise NotYet(f"{what}: waiting for the machine", retry_in=retry_in)
        agents.command_take(command=finished)
        return _value(finished, what)

    def observe(self, record: Record, agent_id: str, call: Call) -> Any:
        _agent, state = _agent_and_state(agent_id)
        if state is None or not state.is_connected:
            raise NotYet("the agent is not connected")
        return self.run(record, agent_id, "observe", call, wait=OBSERVE_WAIT_SECONDS)

    def request(self, record: Record, agent_id: str, op: str, call: Call, *, purpose: Purpose, timeout: float) -> Any:
        agent, state = _recent_agent_and_state(agent_id)
        what = f"{op} on agent {agent.name if agent is not None else agent_id}"
        if agent is None or state is None or not state.is_connected or agent.phase in (Phase.DELETING, Phase.DELETED):
            _away(record, purpose, agent, state, what)
        assert agent is not None
        assert state is not None
        # The function bounds itself by ``timeout``; the machine stops it a little after that.
        payload = {**call.payload(), "timeout": timeout + MARGIN_SECONDS / 2}
        if call.in_process and state.channel_name and live.available():
            try:
                result = _live_request(record, purpose, agent_id, state, payload, call, timeout + MARGIN_SECONDS, what)
            except live.Unsupported:
                pass  # an agent from before live calls: as a command
            else:
                return _request_value(result, what)
        command = _submit(agent, record, f"{agents.SYNC_OPERATION}{op}", call, payload, what)
        finished = _wait_in_place(record, purpose, agent_id, command, timeout + MARGIN_SECONDS, what)
        agents.command_take(command=finished)
        return _request_value({**(finished.result or {}), "status": finished.status, "error": finished.error}, what)

    def abandon(self, record: Record, error: Abandoned, *, left: str) -> None:
        records.record_event_write(
            record.pk,
            EventType.ERROR,
            reason="DeletionAbandoned",
            message=f"{error}; {left} may be left on the machine",
            data={"abandoned": True, "left": left},
        )


def _agent_and_state(agent_id: str) -> tuple[Record | None, Agent | None]:
    """The agent record (``None`` if it does not exist) and its connection state."""
    try:
        pk = uuid.UUID(str(agent_id))
    except ValueError:
        raise PermanentError(f"agent {agent_id!r} is not an agent record id (a UUID)") from None
    # One query for both while the agent has a connection state (each engine request asks).
    state = Agent.objects.select_related("record").filter(pk=pk, record__kind=agents.AGENT_KIND).first()
    if state is not None:
        return state.record, state
    return Record.objects.filter(pk=pk, kind=agents.AGENT_KIND).first(), None


_recent = threading.local()


def _recent_agent_and_state(agent_id: str) -> tuple[Record | None, Agent | None]:
    """``_agent_and_state``, read at most ``CHECK_SECONDS`` ago by this thread while the agent
    was connected: what a wait already trusts for as long (the docker kinds make a dozen
    requests in a row). A connection that ended meanwhile is noticed as in a wait: its
    gateway answers ``lost``, or the next look at the state finds it."""
    seen: dict[str, tuple[float, Record | None, Agent | None]] = _recent.__dict__.setdefault("seen", {})
    now = time.monotonic()
    found = seen.get(agent_id)
    if found is not None and now - found[0] < CHECK_SECONDS:
        return found[1], found[2]
    agent, state = _agent_and_state(agent_id)
    if agent is not None and state is not None and state.is_connected and agent.phase not in _GONE:
        seen[agent_id] = (now, agent, state)
    else:
        seen.pop(agent_id, None)
    return agent, state


def _forget_recent(agent_id: str) -> None:
    _recent.__dict__.setdefault("seen", {}).pop(agent_id, None)


def _submit(agent: Record, record: Record, op: str, call: Call, payload: dict[str, Any], what: str) -> AgentCommand:
    """Store the ``call`` command for ``record``'s ``op``; a refusal as the kinds' error."""
    try:
        return agents.command_submit(
            agent=agent,
            kind=CommandKind.CALL,
            payload=payload,
            waiting_record=record.pk,
            operation=op,
            sealed=call.sealed,
            in_process=call.in_process,
        )
    except ValidationFailed as exc:  # too big for a command, say: no retry makes it fit
        raise PermanentError(f"{what}: {exc.detail}") from exc
    except Exception as exc:  # refused (being deleted meanwhile): decide again next time
        raise KindError(f"{what}: {getattr(exc, 'detail', exc)}") from exc


def _pending(record: Record, op: str) -> AgentCommand | None:
    """The newest command of ``op`` for ``record`` whose result nobody took yet."""
    return (
        AgentCommand.objects.filter(
            waiting_record_id=record.pk,
            consumed_at__isnull=True,
            kind=CommandKind.CALL,
            operation=op,
        )
        .order_by("-created_at")
        .first()
    )


def _done_since_deletion(record: Record, op: str) -> AgentCommand | None:
    """A succeeded, taken command of ``op`` for ``record`` since its deletion was requested."""
    if record.deletion_requested_at is None:
        return None
    return (
        AgentCommand.objects.filter(
            waiting_record_id=record.pk,
            consumed_at__isnull=False,
            status=CommandStatus.SUCCEEDED,
            kind=CommandKind.CALL,
            operation=op,
            created_at__gte=record.deletion_requested_at,
        )
        .order_by("-created_at")
        .first()
    )


def _wait(command: AgentCommand, seconds: float) -> AgentCommand | None:
    """The command once finished, or ``None`` after ``seconds``."""
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


def _wait_in_place(
    record: Record, purpose: Purpose, agent_id: str, command: AgentCommand, seconds: float, what: str
) -> AgentCommand:
    """The finished command; if the agent leaves meanwhile or the deadline passes, the command
    is cancelled (nothing is left queued for later) and the operation stops."""
    deadline = time.monotonic() + seconds
    while True:
        finished = _wait(command, min(CHECK_SECONDS, max(deadline - time.monotonic(), 0.0)))
        if finished is not None:
            return finished
        agent, state = _agent_and_state(agent_id)
        away = state is None or not state.is_connected
        if away or time.monotonic() >= deadline:
            agents.command_cancel(command=command)
            if away:
                _away(record, purpose, agent, state, what)
            raise KindError(f"{what}: no answer within {seconds:g}s")


def _live_request(
    record: Record,
    purpose: Purpose,
    agent_id: str,
    state: Agent,
    payload: dict[str, Any],
    call: Call,
    seconds: float,
    what: str,
) -> dict[str, Any]:
    """A live call's result fields (a call command's); ``live.Unsupported`` if the agent's
    connection does not serve them. The agent leaving (or its connection changing) meanwhile
    stops the operation, as for a command; so does the deadline."""
    try:
        clean = agents.command_payload_validate(CommandKind.CALL, payload)  # the limits a command has
    except ValidationFailed as exc:
        raise PermanentError(f"{what}: {exc.detail}") from exc
    deadline = time.monotonic() + seconds
    try:
        pending = live.start(channel_name=state.channel_name, session=state.session, payload=clean, sealed=call.sealed)
    except Exception as exc:  # the channel layer's store is unreachable: retried like any create
        raise KindError(f"{what}: cannot reach the agent's connection: {exc}") from exc
    while True:
        try:
            reply = pending.wait(min(CHECK_SECONDS, deadline - time.monotonic()))
        except Exception as exc:  # sending it failed
            raise KindError(f"{what}: cannot reach the agent's connection: {exc}") from exc
        if reply is not None:
            break
        agent, fresh = _agent_and_state(agent_id)
        if fresh is None or not fresh.is_connected or fresh.session != state.session:
            pending.forget()
            _forget_recent(agent_id)
            _away(record, purpose, agent, fresh, what)
        if time.monotonic() >= deadline:
            pending.forget()
            raise KindError(f"{what}: no answer within {seconds:g}s")
    if reply.get("unsupported"):
        raise live.Unsupported(what)
    if "lost" in reply:
        _forget_recent(agent_id)
        agent, fresh = _agent_and_state(agent_id)
        _away(record, purpose, agent, fresh, f"{what} ({reply['lost']})")
    result: dict[str, Any] = reply.get("result") or {}
    return result


def _request_value(result: dict[str, Any], what: str) -> Any:
    """A request's value, or its failure on the machine as a ``KindError``."""
    if result.get("status") != CommandStatus.SUCCEEDED:
        detail = result.get("error_message") or result.get("error") or result.get("status")
        error_type = result.get("error_type")
        raise KindError(f"{what}: {f'{error_type}: ' if error_type else ''}{detail}")
    return result.get("value")


def _value(command: AgentCommand, what: str) -> Any:
    """The function's return value, or the error it raised on the machine as a kinds' error."""
    result = command.result or {}
    if command.status == CommandStatus.SUCCEEDED:
        return result.get("value")
    detail = result.get("error_message") or command.error or command.status
    error_type = result.get("error_type") or ""
    if error_type in PERMANENT_ERROR_TYPES:
        raise PermanentError(f"{what}: {detail}")
    raise KindError(f"{what}: {f'{error_type}: ' if error_type else ''}{detail}")


def _away(record: Record, purpose: Purpose, agent: Record | None, state: Agent | None, what: str) -> None:
    """A request finds the agent not connected: always raises (see ``Machines.request``)."""
    if purpose == "delete":
        retry_in = _check_reachable(record, agent, state, what, deleting=True)  # Abandoned past the deadline
        raise NotYet(f"{what}: the agent is not connected", retry_in=min(retry_in, AWAY_RETRY_SECONDS * 3))
    if purpose == "observe":
        raise NotYet(f"{what}: the agent is not connected")
    _check_reachable(record, agent, state, what, deleting=False)  # lost: KindError; gone: permanent
    raise NotYet(f"{what}: the agent is not connected; waiting for it", retry_in=AWAY_RETRY_SECONDS)


def _check_reachable(
    record: Record,
    agent: Record | None,
    state: Agent | None,
    what: str,
    *,
    deleting: bool,
    pending: AgentCommand | None = None,
) -> float:
    """Raise if the machine cannot be asked now: ``Abandoned`` for a deletion past its
    deadline (cancelling the command left waiting), ``KindError`` for a lost agent.
    Returns the seconds left until a deletion's deadline (or ``RETRY_SECONDS``)."""
    gone = agent is None or agent.phase in _GONE
    if deleting:
        deadline = timedelta(seconds=settings.GRAPHENE_AGENT_LOST_DELETE_DEADLINE_SECONDS)
        now = timezone.now()
        connected = state is not None and state.is_connected
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


def _when(at: datetime | None) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S} UTC" if at is not None else "an unknown time"


def _lost(state: Agent) -> str:
    return f"the agent is lost (no connection since {_when(state.disconnected_at)})"
