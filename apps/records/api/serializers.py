from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.api.params import MAX_SECONDS, StrictInteger
from apps.observability.models import LogLine
from apps.records.choices import Phase
from apps.records.models import Event, Record


class RecordOutput(serializers.ModelSerializer):
    owner = serializers.UUIDField(source="parent_id", allow_null=True, read_only=True)
    created_by_run = serializers.UUIDField(source="created_by_run_id", allow_null=True, read_only=True)

    class Meta:
        model = Record
        fields = [
            "id",
            "kind",
            "name",
            "namespace",
            "owner",
            "phase",
            "spec",
            "outputs",
            "conditions",
            "labels",
            "expires_at",
            "deletion_requested_at",
            "deleted_at",
            "generation",
            "observed_generation",
            "attempts",
            "last_error",
            "drift_policy",
            "observe_every",
            "observed_at",
            "next_observe_at",
            "heals",
            "protected",
            "protected_by",
            "protected_at",
            "created_by_run",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class OwnerRef(serializers.Serializer):
    id = serializers.UUIDField()
    kind = serializers.CharField()
    name = serializers.CharField()


class RecordDetailOutput(RecordOutput):
    owner_chain = serializers.SerializerMethodField()
    children = serializers.SerializerMethodField()
    deletion_blocked_by = serializers.SerializerMethodField(
        help_text="protected records (it, or ones it owns) that its requested deletion waits on"
    )

    class Meta(RecordOutput.Meta):
        fields = [*RecordOutput.Meta.fields, "moved_from", "owner_chain", "children", "deletion_blocked_by"]
        read_only_fields = fields

    def get_owner_chain(self, obj: Record) -> list[dict[str, Any]]:
        return [{"id": str(r.pk), "kind": r.kind, "name": r.name} for r in self.context["owner_chain"]]

    @extend_schema_field(OwnerRef(many=True))
    def get_deletion_blocked_by(self, obj: Record) -> list[dict[str, Any]]:
        return [{"id": str(r.pk), "kind": r.kind, "name": r.name} for r in self.context.get("blocked_by", [])]

    def get_children(self, obj: Record) -> dict[str, int]:
        counts: dict[str, int] = self.context["children"]
        return {"total": sum(counts.values()), **counts}


@extend_schema_field({"type": "string", "format": "uuid", "nullable": True})
class _OwnerId(serializers.JSONField):
    """A record id, or null; a list is refused with a hint (a record has exactly one owner)."""


@extend_schema_field({"type": "object", "additionalProperties": True})
class _Object(serializers.JSONField):
    """A JSON object (the kind's spec schema says more)."""


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}})
class _Labels(serializers.JSONField):
    """Labels: strings to strings."""


class RecordApplyInput(serializers.Serializer):
    kind = serializers.CharField(max_length=200)
    name = serializers.CharField(max_length=253)
    owner = _OwnerId(required=False, allow_null=True, help_text="id of the owning record")
    spec = _Object(required=False, default=dict)
    labels = _Labels(required=False, default=dict)
    namespace = serializers.CharField(max_length=63, required=False, default="default")
    ttl_seconds = StrictInteger(required=False, min_value=1, max_value=MAX_SECONDS, allow_null=True)
    expires_at = serializers.DateTimeField(required=False, allow_null=True)
    on_drift = serializers.ChoiceField(
        choices=["heal", "report"], default="heal", help_text="what the drift scheduler does on a difference"
    )
    reconcile_every_seconds = StrictInteger(
        required=False, allow_null=True, min_value=1, max_value=7 * 86400, help_text="default: the kind's interval"
    )

    def validate_owner(self, value: Any) -> Any:
        if isinstance(value, list):
            raise serializers.ValidationError(
                "a record has exactly one owner; pass a single record id (give it away later with transfer)"
            )
        if value is not None and not isinstance(value, str):
            raise serializers.ValidationError("must be a record id")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("ttl_seconds") and attrs.get("expires_at"):
            raise serializers.ValidationError({"ttl_seconds": ["pass ttl_seconds or expires_at, not both"]})
        return attrs


class TransferInput(serializers.Serializer):
    to = serializers.UUIDField(help_text="id of the new owner")
    from_ = serializers.UUIDField(required=False, help_text="the current owner, giving the record away")
    ttl_seconds = StrictInteger(required=False, min_value=1, max_value=MAX_SECONDS)

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = fields.pop("from_")
        return fields


class ExtendInput(serializers.Serializer):
    by_seconds = StrictInteger(min_value=1, max_value=MAX_SECONDS, help_text="push the deadline this much further")


class EventOutput(serializers.ModelSerializer):
    record = serializers.UUIDField(source="record_id", read_only=True)
    actor = serializers.SerializerMethodField()

    class Meta:
        model = Event
        fields = ["id", "record", "type", "reason", "message", "data", "actor", "created_at"]
        read_only_fields = fields

    def get_actor(self, obj: Event) -> str | None:
        return obj.actor.get_username() if obj.actor_id and obj.actor else None


class KindOutput(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    spec_schema = serializers.JSONField()
    drift_interval_seconds = serializers.IntegerField(allow_null=True)


class TreeNode(serializers.Serializer):
    id = serializers.UUIDField()
    kind = serializers.CharField()
    name = serializers.CharField()
    phase = serializers.ChoiceField(choices=Phase.choices)
    expires_at = serializers.DateTimeField(allow_null=True)
    protected = serializers.BooleanField(help_text="a deletion stops here until it is unprotected")
    children = serializers.ListField(child=serializers.DictField())
    truncated = serializers.BooleanField(help_text="deeper descendants exist beyond the requested depth")


class LogLineOutput(serializers.ModelSerializer):
    record = serializers.UUIDField(source="record_id", read_only=True)
    record_name = serializers.CharField(source="record.name", read_only=True)

    class Meta:
        model = LogLine
        fields = ["id", "record", "record_name", "at", "stream", "severity", "source", "message"]
        read_only_fields = fields


class LogPage(serializers.Serializer):
    """A page of a record's log, and how many lines the log bounds removed from what it covers."""

    next = serializers.URLField(allow_null=True, help_text="the next page (after a tail: the lines after it)")
    previous = serializers.URLField(allow_null=True)
    results = LogLineOutput(many=True)
    dropped = serializers.IntegerField(help_text="lines the log bounds removed from the covered records' logs")


class SweepOutput(serializers.Serializer):
    dry_run = serializers.BooleanField()
    found = serializers.IntegerField()
    orphans = serializers.ListField(child=serializers.DictField(), help_text="one object per orphan found")
