"""Reads of agents and their commands. Visibility goes through ``record_visible`` (records)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import QuerySet

from apps.agents.models import Agent, AgentCommand
from apps.agents.services import AGENT_KIND
from apps.core.errors import NotFound, ValidationFailed
from apps.core.selectors import get_by_uuid
from apps.records.choices import Phase
from apps.records.models import Record
from apps.records.selectors import User, filter_labels, record_visible

COMMAND_EXEC_PERMISSION = "agents.add_agentcommand"


def agent_list(
    *, user: User, connected: bool | None = None, labels: dict[str, str] | None = None, include_deleted: bool = False
) -> QuerySet[Record]:
    """Agent records the user may see, with their connection state (one query, no N+1)."""
    qs = record_visible(user=user).filter(kind=AGENT_KIND).select_related("agent_state")
    if not include_deleted:
        qs = qs.exclude(phase=Phase.DELETED)
    if connected is True:
        qs = qs.filter(agent_state__session__isnull=False)
    elif connected is False:
        qs = qs.exclude(agent_state__session__isnull=False)
    if labels:
        qs = filter_labels(qs, labels)
    return qs


def agent_get(*, user: User, agent_id: Any) -> Record:
    return get_by_uuid(agent_list(user=user, include_deleted=True), agent_id, noun="agent")


def agent_state(*, record: Record) -> Agent | None:
    return Agent.objects.filter(pk=record.pk).first()


def agent_is_connected(*, record: Record) -> bool:
    return Agent.objects.filter(pk=record.pk, session__isnull=False).exists()


def agent_can_run_commands(*, user: User) -> bool:
    """Running commands on machines is a separate right from seeing them."""
    has_perm = getattr(user, "has_perm", None)  # AbstractBaseUser alone has no permissions
    return bool(user.is_authenticated and has_perm is not None and has_perm(COMMAND_EXEC_PERMISSION))


def command_list(*, agent: Record, statuses: list[str] | None = None) -> QuerySet[AgentCommand]:
    qs = AgentCommand.objects.filter(agent=agent)
    if statuses:
        from apps.agents.choices import CommandStatus

        unknown = sorted(set(statuses) - set(CommandStatus.values))
        if unknown:
            raise ValidationFailed(
                f"unknown status {unknown}; statuses are {CommandStatus.values}", fields={"status": unknown}
            )
        qs = qs.filter(status__in=statuses)
    return qs


def command_get(*, command_id: Any, agent: Record | None = None) -> AgentCommand:
    try:
        pk = uuid.UUID(str(command_id))
    except ValueError:
        raise NotFound(f"no command {command_id!r}: command ids are UUIDs") from None
    qs = AgentCommand.objects.all() if agent is None else AgentCommand.objects.filter(agent=agent)
    command = qs.filter(pk=pk).first()
    if command is None:
        raise NotFound(f"no command {command_id}" + (f" on agent {agent.name}" if agent is not None else ""))
    return command
