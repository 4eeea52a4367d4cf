"""Agents over REST: shapes in and out. Validation of commands lives in the service, so the API
and the engine refuse the same things with the same messages."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.agents.choices import Guarantee
from apps.agents.models import AgentCommand
from apps.agents.services.payloads import MAX_ARGV, MAX_TIMEOUT_SECONDS
from apps.api.strict import StrictInput
from apps.records.models import Record


class AgentOutput(serializers.ModelSerializer[Record]):
    owner = serializers.UUIDField(source="parent_id", read_only=True)
    connected = serializers.SerializerMethodField()
    connected_at = serializers.SerializerMethodField()
    last_seen_at = serializers.SerializerMethodField()
    disconnected_at = serializers.SerializerMethodField()
    version = serializers.SerializerMethodField()
    peer = serializers.SerializerMethodField()
    facts = serializers.SerializerMethodField()
    capabilities = serializers.SerializerMethodField()

    class Meta:
        model = Record
        fields = [
            "id",
            "name",
            "namespace",
            "owner",
            "phase",
            "labels",
            "conditions",
            "connected",
            "connected_at",
            "last_seen_at",
            "disconnected_at",
            "version",
            "peer",
            "facts",
            "capabilities",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_capabilities(self, record: Record) -> list[dict[str, Any]]:
        """What the machine offers (``ctx.publish_capability``), by name; prefetched by the lists."""
        return [
            {"name": c.name, "version": c.version, "labels": c.labels, "published_at": c.published_at}
            for c in sorted(record.agent_capabilities.all(), key=lambda c: c.name)
        ]

    def _state(self, record: Record) -> Any:
        return getattr(record, "agent_state", None)

    def get_connected(self, record: Record) -> bool:
        state = self._state(record)
        return bool(state is not None and state.is_connected)

    def _time(self, record: Record, name: str) -> str | None:
        value = getattr(self._state(record), name, None)
        return value.isoformat() if value is not None else None

    def get_connected_at(self, record: Record) -> str | None:
        return self._time(record, "connected_at")

    def get_last_seen_at(self, record: Record) -> str | None:
        return self._time(record, "last_seen_at")

    def get_disconnected_at(self, record: Record) -> str | None:
        return self._time(record, "disconnected_at")

    def get_version(self, record: Record) -> str:
        return str(getattr(self._state(record), "version", "") or "")

    def get_peer(self, record: Record) -> str:
        return str(getattr(self._state(record), "peer", "") or "")

    def get_facts(self, record: Record) -> dict[str, Any]:
        facts = (record.outputs or {}).get("facts")
        return facts if isinstance(facts, dict) else {}


class CommandOutput(serializers.ModelSerializer[AgentCommand]):
    agent = serializers.UUIDField(source="agent_id", read_only=True)
    payload = serializers.SerializerMethodField()

    class Meta:
        model = AgentCommand
        fields = [
            "id",
            "agent",
            "kind",
            "status",
            "guarantee",
            "payload",
            "exit_code",
            "error",
            "stdout_tail",
            "stderr_tail",
            "result",
            "output_seq",
            "deliveries",
            "cancel_requested_at",
            "created_at",
            "sent_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_payload(self, command: AgentCommand) -> dict[str, Any]:
        payload = dict(command.payload)
        if "$sealed" in payload:  # it carries a secret's value: encrypted at rest, never shown
            payload["$sealed"] = "<encrypted>"
        if "data" in payload:  # put_file content: report its size, not the bytes
            payload["data"] = f"<{len(payload['data']) * 3 // 4} bytes, base64>"
        return payload


# The shapes the command service takes (apps/agents/services/payloads.py), declared for the
# schema; the service checks them (the API and the engine refuse alike).
@extend_schema_field({"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": MAX_ARGV})
class _Argv(serializers.JSONField):
    pass


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}, "nullable": True})
class _Env(serializers.JSONField):
    pass


@extend_schema_field({"type": "string", "nullable": True, "description": "an absolute path"})
class _Cwd(serializers.JSONField):
    pass


@extend_schema_field(
    {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": MAX_TIMEOUT_SECONDS, "nullable": True}
)
class _Timeout(serializers.JSONField):
    pass


class ExecInput(StrictInput):
    argv = _Argv(help_text="the program and its arguments: a non-empty list of strings")
    env = _Env(required=False, help_text="variables added to the agent's environment")
    cwd = _Cwd(required=False, help_text="absolute working directory on the machine")
    timeout = _Timeout(required=False, help_text="seconds; the process group is killed after it")
    guarantee = serializers.ChoiceField(choices=Guarantee.choices, default=Guarantee.AT_LEAST_ONCE)


class AgentCreateInput(StrictInput):
    name = serializers.CharField(max_length=253, help_text="the agent's name, unique among its owner's agents")
    labels = serializers.DictField(
        child=serializers.CharField(allow_blank=True), required=False, default=dict, help_text="k: v labels"
    )
    owner = serializers.UUIDField(
        required=False, allow_null=True, help_text="the owning record's id (default: the stand root 'agents')"
    )
    namespace = serializers.CharField(
        max_length=63, required=False, default="default", help_text="where the agent lives (with no owner)"
    )


class AgentEnrollmentOutput(serializers.Serializer[Any]):
    """The agent and its install data. Both forms hold one single-use bootstrap token: a secret
    until the agent has connected with it."""

    agent = AgentOutput()
    created = serializers.BooleanField(help_text="false: the agent existed; this is a fresh token for it")
    install_script = serializers.CharField(help_text="a POSIX shell script; also usable as cloud-init user-data")
    cloud_config = serializers.CharField(help_text="the same as #cloud-config user-data (write_files + runcmd)")
    bootstrap_expires_at = serializers.DateTimeField(allow_null=True)
