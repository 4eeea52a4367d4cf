"""Reads of agents and their commands. Visibility goes through ``record_visible`` (records)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce

from apps.agents.choices import OPEN
from apps.agents.models import Agent, AgentCapability, AgentCommand
from apps.agents.services import AGENT_KIND
from apps.core import access
from apps.core.errors import NotFound, ValidationFailed
from apps.core.selectors import get_by_uuid
from apps.records.choices import Phase
from apps.records.models import Record
from apps.records.selectors import User, filter_labels, record_visible


def agent_list(
    *, user: User, connected: bool | None = None, labels: dict[str, str] | None = None, include_deleted: bool = False
) -> QuerySet[Record]:
    """Agent records the user may see, with their connection state (one query, no N+1)."""
    qs = (
        record_visible(user=user, resource="agents")
        .filter(kind=AGENT_KIND)
        .select_related("agent_state")
        .prefetch_related("agent_capabilities")
    )
    if not include_deleted:
        qs = qs.exclude(phase=Phase.DELETED)
    if connected is True:
        qs = qs.filter(agent_state__session__isnull=False)
    elif connected is False:
        qs = qs.exclude(agent_state__session__isnull=False)
    if labels:
        qs = filter_labels(qs, labels)
    return qs


def agent_board(*, user: User) -> list[Record]:
    """Live agents for the Studio's board, connected first, then by name: each with its
    connection (``agent_state``), capabilities and ``open_commands`` (queued, sent or running).
    Three queries, whatever the number of agents."""
    open_commands = (
        AgentCommand.objects.filter(agent=OuterRef("pk"), status__in=sorted(OPEN))
        .order_by()
        .values("agent")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return list(
        agent_list(user=user)
        .annotate(open_commands=Coalesce(Subquery(open_commands), 0))
        .order_by(F("agent_state__session").asc(nulls_last=True), "name", "pk")
    )


def agent_connection_counts(*, user: User) -> dict[str, int]:
    """Live agents by connection: ``connected``, ``lost`` (away past the grace period) and
    ``disconnected`` (away for less; may come back at once). One aggregate."""
    live = record_visible(user=user, resource="agents").filter(kind=AGENT_KIND).exclude(phase=Phase.DELETED)
    counts = Agent.objects.filter(record__in=live).aggregate(
        connected=Count("pk", filter=Q(session__isnull=False)),
        lost=Count("pk", filter=Q(session__isnull=True, lost_at__isnull=False)),
        total=Count("pk"),
    )
    return {
        "connected": counts["connected"],
        "disconnected": counts["total"] - counts["connected"] - counts["lost"],
        "lost": counts["lost"],
    }


def agent_get(*, user: User, agent_id: Any) -> Record:
    return get_by_uuid(agent_list(user=user, include_deleted=True), agent_id, noun="agent")


def agent_state(*, record: Record) -> Agent | None:
    return Agent.objects.filter(pk=record.pk).first()


def agent_is_connected(*, record: Record) -> bool:
    return Agent.objects.filter(pk=record.pk, session__isnull=False).exists()


def agent_can_run_commands(*, user: User, agent: Record) -> bool:
    """Running commands on machines is a separate right from seeing them (verb ``exec``)."""
    return access.may(user, "exec", "agents", agent.namespace)


def agent_can_open_terminal(*, user: User, agent: Record) -> bool:
    """A terminal is a shell on the machine: its own right (``open_terminal``), not implied by ``exec``."""
    return access.may(user, "open_terminal", "agents", agent.namespace)


def agent_connection(*, record: Record) -> Agent | None:
    """The agent's current connection (its gateway channel and session), if it is connected."""
    return Agent.objects.filter(pk=record.pk, session__isnull=False).exclude(channel_name="").first()


def agent_connection_is_current(*, record_id: Any, channel_name: str) -> bool:
    """Whether ``channel_name`` is still the agent's current connection."""
    return Agent.objects.filter(pk=record_id, channel_name=channel_name, session__isnull=False).exists()


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


def command_get(*, command_id: Any, agent: Record | None = None, with_payload: bool = True) -> AgentCommand:
    """One command; ``with_payload=False`` leaves out what was sent (a put_file's content)."""
    try:
        pk = uuid.UUID(str(command_id))
    except ValueError:
        raise NotFound(f"no command {command_id!r}: command ids are UUIDs") from None
    qs = AgentCommand.objects.all() if agent is None else AgentCommand.objects.filter(agent=agent)
    if not with_payload:
        qs = qs.defer("payload")
    command = qs.filter(pk=pk).first()
    if command is None:
        raise NotFound(f"no command {command_id}" + (f" on agent {agent.name}" if agent is not None else ""))
    return command


def _need_met(need: dict[str, Any], capability: AgentCapability | None) -> bool:
    if capability is None:
        return False
    values = {**capability.labels, "version": capability.version}
    if any(values.get(k) != v for k, v in need["where_label"].items()):
        return False
    return all(values.get(k) in allowed for k, allowed in need["where_in"].items())


def _describe_need(need: dict[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in sorted(need["where_label"].items())]
    parts += [f"{k} in {sorted(v)}" for k, v in sorted(need["where_in"].items())]
    return need["name"] + (f" ({', '.join(parts)})" if parts else "")


def _published(capabilities: Any) -> str:
    """What an agent publishes, shortly: ``docker 24, python 3.11``, or ``nothing``."""
    names = [f"{c.name} {c.version}".strip() for c in capabilities]
    return ", ".join(names) if names else "nothing"


def agent_needs_unmet(*, agent: Record, needs: list[dict[str, Any]]) -> list[str]:
    """The needs (cleaned by ``services.needs_clean``) that ``agent``'s capabilities do not meet,
    each as a sentence naming what it found instead."""
    offered = {c.name: c for c in AgentCapability.objects.filter(agent=agent).order_by("name")}
    unmet = []
    for need in needs:
        capability = offered.get(need["name"])
        if _need_met(need, capability):
            continue
        if capability is None:
            unmet.append(
                f"needs {_describe_need(need)}: the agent does not publish {need['name']!r} "
                f"(it publishes {_published(offered.values())})"
            )
        else:
            values = {**capability.labels, "version": capability.version}
            found = ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
            unmet.append(f"needs {_describe_need(need)}: it publishes {need['name']} with {found}")
    return unmet


def agent_declared_needs_unmet(*, record: Record) -> list[str] | None:
    """What the needs an agent record was declared with (``spec.needs``) lack on its machine;
    ``None``: it was declared without needs (its readiness is its connection's)."""
    needs = (record.spec or {}).get("needs")
    return agent_needs_unmet(agent=record, needs=needs) if needs else None


def agents_select(
    *,
    labels: dict[str, str] | None = None,
    needs: list[dict[str, Any]] | None = None,
    namespace: str | None = None,
    limit: int = 1000,
) -> list[Record]:
    """Live agent records whose labels match and whose capabilities meet every need, by name
    (``namespace``: only that namespace's; a run selects only among its own namespace's agents).

    The capability names are matched in SQL (one EXISTS per need, over the name index), the
    label conditions of the few agents left in Python.
    """
    qs: QuerySet[Record] = Record.objects.filter(kind=AGENT_KIND, deletion_requested_at__isnull=True).exclude(
        phase=Phase.DELETED
    )
    if namespace is not None:
        qs = qs.filter(namespace=namespace)
    if labels:
        qs = filter_labels(qs, labels)
    for need in needs or []:
        qs = qs.filter(Exists(AgentCapability.objects.filter(agent=OuterRef("pk"), name=need["name"])))
    found = list(qs.select_related("agent_state").order_by("name", "pk")[:limit])
    if not needs:
        return found
    by_agent: dict[Any, dict[str, AgentCapability]] = {}
    for capability in AgentCapability.objects.filter(
        agent__in=[r.pk for r in found], name__in=[n["name"] for n in needs]
    ):
        by_agent.setdefault(capability.agent_id, {})[capability.name] = capability
    return [r for r in found if all(_need_met(n, by_agent.get(r.pk, {}).get(n["name"])) for n in needs)]


def agent_find(*, name_or_id: str, namespace: str | None = None) -> list[Record]:
    """Live agent records with this id or name (a name may match several: the caller decides),
    in ``namespace`` when given (a run attaches only its own namespace's agents)."""
    qs = Record.objects.filter(kind=AGENT_KIND, deletion_requested_at__isnull=True).exclude(phase=Phase.DELETED)
    if namespace is not None:
        qs = qs.filter(namespace=namespace)
    try:
        pk = uuid.UUID(str(name_or_id))
    except ValueError:
        return list(qs.filter(name=name_or_id).order_by("created_at")[:10])
    return list(qs.filter(pk=pk))


def capability_list(*, agent: Record) -> QuerySet[AgentCapability]:
    return AgentCapability.objects.filter(agent=agent).order_by("name")
