"""Connection: an agent's hello, heartbeats, goodbye, and absence, as its record's phase.

The record is ``ready`` while its agent is connected: the hello moves it to ``ready``
(through ``creating`` when it was never ready); a disconnect sets the ``Connected`` condition
to false at once, and a disconnection that outlives ``GRAPHENE_AGENT_DISCONNECT_GRACE_SECONDS``
turns it ``drifted`` (a reconnect makes it ``ready`` again). Moves go through the records
app's ``record_transition``, the one place that checks them and writes their events.

An agent declared with needs is ``ready`` only while it is connected *and* its machine
publishes them (``capability_publish``); the ``NeedsMet`` condition says which are missing.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from graphene_agent import protocol

from apps.agents.models import Agent
from apps.agents.services.base import AgentRefused, _audit, _now, _retired, _set_condition
from apps.agents.services.commands import _commands_vanished
from apps.core.events import publish_on_commit
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Record


def agent_connect(
    *,
    record_id: Any,
    session: uuid.UUID,
    channel_name: str,
    instance: str,
    version: str,
    facts: dict[str, Any],
    peer: str = "",
) -> str | None:
    """The agent said hello on connection ``session``: it is now the current one.

    Records the facts in the record's outputs, sets ``Connected``, moves the record to
    ``ready``, and returns the channel of a previous connection to close (it is superseded).
    """
    now = _now()
    with transaction.atomic():
        record = Record.objects.select_for_update(no_key=True).get(pk=record_id)
        if _retired(record):
            raise AgentRefused(
                f"agent {record.pk} is being deleted", close_code=protocol.CLOSE_DELETED, reason="AgentDeleted"
            )
        state, _ = Agent.objects.select_for_update().get_or_create(record_id=record.pk)
        previous = state.channel_name if state.session is not None and state.session != session else None
        Agent.objects.filter(pk=record.pk).update(
            session=session,
            channel_name=channel_name,
            instance=instance[:64],
            version=version[:40],
            peer=peer[:100],
            connected_at=now,
            last_seen_at=now,
            disconnected_at=None,
            lost_at=None,
        )
        outputs = {"facts": facts, "version": version, "instance": instance}
        previous_outputs = record.outputs or {}
        _audit(
            "agent.connect",
            record,
            actor=None,  # the gateway's context: the agent
            before={key: previous_outputs.get(key) for key in outputs} if previous_outputs else None,
            after=outputs,
            peer=peer[:100],
            version=version[:40],
            instance=instance[:64],
        )
        conditions = _set_condition(
            record.conditions, "Connected", True, reason="Connected", message=f"connected from {peer or 'unknown'}"
        )
        fields = {
            "outputs": outputs,
            "conditions": conditions,
            "attempts": 0,
            "next_attempt_at": None,
            "last_error": "",
            "observed_generation": record.generation,
        }
        from apps.agents.selectors import agent_declared_needs_unmet  # selectors import this package

        unmet = agent_declared_needs_unmet(record=record)
        if unmet is not None:
            fields["conditions"] = conditions = _needs_condition(conditions, unmet)
        if record.phase in (Phase.PENDING, Phase.CREATE_FAILED):
            records.record_transition([record], Phase.CREATING, reason="Connected", message="the agent connected")
        if unmet:  # connected, but not what the declaration needs: not ready (yet)
            _settle(record, fields, ready=False, reason="NeedsUnmet", message="; ".join(unmet))
        else:
            _settle(record, fields, ready=True, reason="Connected", message="the agent said hello")
    return previous


def _needs_condition(conditions: Sequence[Mapping[str, Any]], unmet: list[str]) -> list[dict[str, Any]]:
    if unmet:
        return _set_condition(conditions, "NeedsMet", False, reason="NeedsUnmet", message="; ".join(unmet))
    return _set_condition(conditions, "NeedsMet", True, reason="NeedsMet", message="every need is published")


def _settle(record: Record, fields: dict[str, Any], *, ready: bool, reason: str, message: str) -> None:
    """Move a connected agent's record to what its needs say: ``ready``, or not (``creating``
    before it was ever ready, ``drifted`` after), writing ``fields`` with the move."""
    was_ready = record.phase in (Phase.READY, Phase.DRIFTED)
    target = Phase.READY if ready else (Phase.DRIFTED if was_ready else Phase.CREATING)
    if record.phase == Phase.PENDING:
        records.record_transition([record], Phase.CREATING, reason=reason, message=message)
    if record.phase != target:
        records.record_transition([record], target, reason=reason, message=message, fields=fields)
    else:
        _record_changed(record.pk, updated_at=_now(), **fields)


def _record_changed(record_id: Any, **fields: Any) -> None:
    """Write fields of an agent's record that move no phase; its watchers re-fetch it."""
    Record.objects.filter(pk=record_id).update(**fields)
    publish_on_commit("records", {"event": "records.changed", "ids": [str(record_id)]})


def _needs_settle(record: Record) -> None:
    """Re-decide a connected agent's readiness after what its machine offers changed.

    ``record`` is locked by the caller (``capability_publish``) and not being deleted.
    """
    from apps.agents.selectors import agent_declared_needs_unmet  # selectors import this package

    unmet = agent_declared_needs_unmet(record=record)
    if unmet is None or not Agent.objects.filter(pk=record.pk, session__isnull=False).exists():
        return  # no needs (readiness is the connection's), or away (the hello decides)
    fields: dict[str, Any] = {"conditions": _needs_condition(record.conditions, unmet)}
    if unmet:
        _settle(record, fields, ready=False, reason="NeedsUnmet", message="; ".join(unmet))
    else:
        fields.update(attempts=0, next_attempt_at=None, last_error="", observed_generation=record.generation)
        _settle(record, fields, ready=True, reason="NeedsMet", message="the machine publishes every need")


def agent_heartbeat(*, record_id: Any, session: uuid.UUID) -> bool:
    """Note that the agent is alive; ``False`` if this connection is no longer the current one."""
    return Agent.objects.filter(pk=record_id, session=session).update(last_seen_at=_now()) == 1


def agent_disconnect(*, record_id: Any, session: uuid.UUID, reason: str = "Disconnected") -> bool:
    """Connection ``session`` ended. Sets ``Connected`` false; the phase waits out the grace period."""
    now = _now()
    with transaction.atomic():
        if not Agent.objects.filter(pk=record_id, session=session).update(
            session=None, channel_name="", disconnected_at=now
        ):
            return False  # superseded by a newer connection: nothing to change
        record = Record.objects.select_for_update(no_key=True).get(pk=record_id)
        conditions = _set_condition(
            record.conditions, "Connected", False, reason=reason, message=f"disconnected at {now.isoformat()}"
        )
        _record_changed(record.pk, conditions=conditions, updated_at=now)
    return True


def agents_mark_lost(*, now: datetime | None = None) -> int:
    """Agents disconnected past the grace period: record ``drifted``, in-flight at-most-once ``unknown``.

    Also ends connections whose heartbeats stopped (a web process that died without closing
    them leaves them looking connected).
    """
    now = now or _now()
    grace = timedelta(seconds=settings.GRAPHENE_AGENT_DISCONNECT_GRACE_SECONDS)
    silent = now - max(grace, timedelta(seconds=3 * settings.GRAPHENE_AGENT_HEARTBEAT_SECONDS))
    for state in Agent.objects.filter(session__isnull=False, last_seen_at__lt=silent):
        if state.session is not None:
            agent_disconnect(record_id=state.pk, session=state.session, reason="HeartbeatsStopped")
    lost = 0
    candidates = Agent.objects.filter(session__isnull=True, lost_at__isnull=True, disconnected_at__lte=now - grace)
    for record_id in candidates.values_list("pk", flat=True):
        with transaction.atomic():
            record = Record.objects.select_for_update(no_key=True).get(pk=record_id)
            state = Agent.objects.select_for_update().get(pk=record_id)
            if state.session is not None or state.lost_at is not None or state.disconnected_at is None:
                continue
            Agent.objects.filter(pk=record_id).update(lost_at=now)
            since = state.disconnected_at.isoformat()
            conditions = _set_condition(
                record.conditions, "Connected", False, reason="Lost", message=f"no reconnect since {since}"
            )
            if record.phase == Phase.READY and record.deletion_requested_at is None:
                records.record_transition(
                    [record],
                    Phase.DRIFTED,
                    reason="AgentLost",
                    message=f"disconnected since {since}, past the {grace.total_seconds():.0f}s grace period",
                    fields={"conditions": conditions},
                )
            else:
                Record.objects.filter(pk=record_id).update(conditions=conditions, updated_at=now)
            _commands_vanished(record_id, f"the agent vanished while it was in flight (disconnected since {since})")
            lost += 1
    return lost
