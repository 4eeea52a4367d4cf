"""The ``agent`` kind: a machine agent, ready only while it is connected.

The "external object" is the agent's live connection (and, with ``needs`` in the spec, the
capabilities its machine publishes). ``create`` succeeds once the agent is connected (it
returns the facts of its hello); before that the record waits (``Waiting``: a ``Waiting``
note in its history, no error and no attempt counted: a machine that takes minutes to boot
is not a failure), and the gateway itself moves the record to ``ready`` the moment the agent
says hello (or, with needs, once they are published), so a create retry is only a safety net.
``delete`` retires the agent (revokes its credentials, ends its commands, tells it to go)
and never waits for the machine: a machine that is gone for good must not keep its record
from being deleted.

It lives in the agents app, not in ``kinds/``: its object is this app's own rows. It is
registered like any kind (the ``graphene.kinds`` entry point ``agent``).
"""

from __future__ import annotations

from typing import Any

from apps.agents.selectors import agent_declared_needs_unmet, agent_is_connected
from apps.agents.services import agent_retire
from apps.records.models import Record
from kinds import Kind, NotYet, Observed, Waiting

# The hello moves the record to ready at once: looking again is only a safety net.
WAIT_RETRY_SECONDS = 60.0


class AgentKind(Kind):
    name = "agent"
    description = (
        "A machine running graphene-agent, which dials out to the server (it listens on no port). "
        "Ready while connected; its facts (hostname, os, arch, cpus, memory, addresses) are its outputs."
    )
    spec_schema = {
        "type": "object",
        "properties": {
            "needs": {
                "type": "array",
                "description": "capabilities its machine must publish before it is ready (need(...) in the SDK)",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "minLength": 1, "maxLength": 100},
                        "where_label": {"type": "object", "additionalProperties": {"type": "string"}},
                        "where_in": {
                            "type": "object",
                            "additionalProperties": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                        },
                    },
                    "required": ["name"],
                    "additionalProperties": False,
                },
            }
        },
        "additionalProperties": False,
    }
    drift_interval = None  # readiness follows the connection, not observation

    def create(self, record: Record) -> dict[str, Any]:
        if not agent_is_connected(record=record):
            raise Waiting(
                f"waiting for agent {record.name} to connect (install it with its bootstrap token)",
                retry_in=WAIT_RETRY_SECONDS,
            )
        unmet = agent_declared_needs_unmet(record=record)
        if unmet:  # publishing a capability settles it (capability_publish); this is the net
            raise NotYet(f"agent {record.name} is connected but not ready: {'; '.join(unmet)}", retry_in=60)
        # The hello wrote the facts after ``record`` was read: return the row's, not the snapshot's.
        outputs: dict[str, Any] = Record.objects.filter(pk=record.pk).values_list("outputs", flat=True).first() or {}
        return outputs

    def observe(self, record: Record) -> Observed | None:
        if not agent_is_connected(record=record):
            return None
        return Observed(outputs=dict(record.outputs))

    def delete(self, record: Record) -> None:
        agent_retire(record=record)
