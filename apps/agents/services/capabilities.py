"""Capabilities: what an agent's machine offers (a name, a version, labels), as a run that set
it up publishes it, and the needs an agent's declaration asks of them (``graphene_sdk.need``).
Publishing one re-decides the readiness of an agent declared with needs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import transaction

from apps.agents.models import AgentCapability
from apps.agents.services.base import AGENT_KIND, _fail, _now, _record_event, _retired
from apps.agents.services.connection import _needs_settle
from apps.core.errors import Conflict, ValidationFailed
from apps.records import services as records
from apps.records.choices import EventType
from apps.records.models import Record

CAPABILITY_NAME_MAX = 100


def needs_clean(needs: Any) -> list[dict[str, Any]]:
    """Validate needs (``graphene_sdk.need(...)`` as JSON): ``[{name, where_label, where_in}]``.

    ``where_label`` maps a capability label to the value it must have; ``where_in`` maps a
    label (or ``version``) to the values it may have.
    """
    if not isinstance(needs, list | tuple):
        raise _fail("needs", "must be a list of needs, e.g. [need('docker', where_label={'arch': 'amd64'})]")
    clean: list[dict[str, Any]] = []
    for index, item in enumerate(needs):
        where = f"needs.{index}"
        if not isinstance(item, Mapping):
            raise ValidationFailed(f"{where}: must be an object with a name", fields={where: ["not an object"]})
        unknown = sorted(set(item) - {"name", "where_label", "where_in"})
        if unknown:
            raise ValidationFailed(
                f"{where}: unknown field(s) {unknown}; a need has name, where_label, where_in",
                fields={where: [f"unknown {unknown}"]},
            )
        name = item.get("name")
        if not isinstance(name, str) or not name or len(name) > CAPABILITY_NAME_MAX:
            raise ValidationFailed(
                f"{where}.name: a capability name of 1 to {CAPABILITY_NAME_MAX} characters is required",
                fields={f"{where}.name": ["required"]},
            )
        where_label = item.get("where_label") or {}
        if not isinstance(where_label, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in where_label.items()
        ):
            raise ValidationFailed(
                f"{where}.where_label: must map label names to string values",
                fields={f"{where}.where_label": ["not a string mapping"]},
            )
        where_in = item.get("where_in") or {}
        if not isinstance(where_in, Mapping) or not all(
            isinstance(k, str) and isinstance(v, list | tuple) and v and all(isinstance(x, str) for x in v)
            for k, v in where_in.items()
        ):
            raise ValidationFailed(
                f"{where}.where_in: must map label names (or 'version') to non-empty lists of strings",
                fields={f"{where}.where_in": ["not a mapping to lists of strings"]},
            )
        clean.append(
            {
                "name": name,
                "where_label": dict(where_label),
                "where_in": {k: list(v) for k, v in where_in.items()},
            }
        )
    return clean


def capability_publish(
    *,
    agent: Record,
    name: str,
    version: str = "",
    labels: Mapping[str, str] | None = None,
    published_by: Any = None,
    actor: records.Actor = None,
) -> AgentCapability:
    """Say that ``agent``'s machine offers ``name`` (replacing what was said of it before)."""
    if agent.kind != AGENT_KIND:
        raise _fail("agent", f"{agent} is not an agent record")
    if not isinstance(name, str) or not name or len(name) > CAPABILITY_NAME_MAX or "\x00" in name:
        raise _fail("name", f"a capability name of 1 to {CAPABILITY_NAME_MAX} characters is required")
    if not isinstance(version, str) or len(version) > 100:
        raise _fail("version", "must be a string of at most 100 characters")
    labels = dict(labels or {})
    if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in labels.items()):
        raise _fail("labels", "must map non-empty label names to string values")
    with transaction.atomic():
        current = Record.objects.select_for_update(no_key=True).filter(pk=agent.pk).first()
        if current is None or _retired(current) or current.deletion_requested_at is not None:
            raise Conflict(f"agent {agent.name} ({agent.pk}) is deleted or being deleted")
        capability, created = AgentCapability.objects.update_or_create(
            agent=agent,
            name=name,
            defaults={"version": version, "labels": labels, "published_at": _now(), "published_by": published_by},
        )
        described = f"{name} {version}".strip()
        _record_event(
            agent.pk,
            EventType.NOTE,
            reason="CapabilityPublished",
            message=f"{'publishes' if created else 'updated'} capability {described}",
            data={"name": name, "version": version, "labels": labels, "run": str(published_by or "")},
        )
        _needs_settle(current)  # after the event: a phase it moves comes next
    return capability
