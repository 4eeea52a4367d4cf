from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.pipelines.models import JournalEntry, Pipeline, Run, RunEvent


class PipelineOutput(serializers.ModelSerializer):
    class Meta:
        model = Pipeline
        fields = [
            "name",
            "namespace",
            "description",
            "source",
            "input_schema",
            "output_schema",
            "concurrency",
            "max_pending",
            "timeout_seconds",
            "updated_at",
        ]
        read_only_fields = fields


class JournalEntryOutput(serializers.ModelSerializer):
    class Meta:
        model = JournalEntry
        fields = ["seq", "call", "status", "result", "error", "created_at", "completed_at"]
        read_only_fields = fields


class RunEventOutput(serializers.ModelSerializer):
    """A move of a run's status: from, to, why, and who made it (null: the system)."""

    actor = serializers.SerializerMethodField()

    class Meta:
        model = RunEvent
        fields = ["id", "from_status", "to_status", "reason", "message", "data", "actor", "created_at"]
        read_only_fields = fields

    def get_actor(self, obj: RunEvent) -> str | None:
        return obj.actor.get_username() if obj.actor_id and obj.actor else None


class RunOutput(serializers.ModelSerializer):
    pipeline = serializers.CharField(source="pipeline.name", read_only=True)
    record = serializers.UUIDField(source="record_id", read_only=True, allow_null=True)
    # The API's field name; DRF's metaclass takes declared fields off the class, so it does not
    # shadow Field.parent (the serializer a field is bound to) at runtime, only for mypy.
    parent = serializers.UUIDField(  # type: ignore[assignment]
        source="parent_run_id", read_only=True, allow_null=True, help_text="the run that started this one"
    )
    parent_name = serializers.SerializerMethodField(help_text="the parent run as pipeline#number")

    class Meta:
        model = Run
        fields = [
            "id",
            "pipeline",
            "namespace",
            "number",
            "status",
            "record",
            "parent",
            "parent_name",
            "inputs",
            "outputs",
            "error",
            "attempt",
            "waiting_on",
            "wake_at",
            "deadline_at",
            "created_at",
            "started_at",
            "finished_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_parent_name(self, obj: Run) -> str | None:
        return str(obj.parent_run) if obj.parent_run_id is not None and obj.parent_run is not None else None


class RunDetailOutput(RunOutput):
    """A run with its journal: the run's own fields, flat, then its first journal entries."""

    journal = serializers.SerializerMethodField(help_text="the journal's first entries, oldest first")
    journal_truncated = serializers.SerializerMethodField(help_text="the journal has more entries than shown")

    class Meta(RunOutput.Meta):
        fields = [*RunOutput.Meta.fields, "journal", "journal_truncated"]
        read_only_fields = fields

    @extend_schema_field(JournalEntryOutput(many=True))
    def get_journal(self, obj: Run) -> list[dict[str, Any]]:
        return list(JournalEntryOutput(self.context["journal"], many=True).data)

    def get_journal_truncated(self, obj: Run) -> bool:
        return bool(self.context["journal_truncated"])


@extend_schema_field({"type": "object", "additionalProperties": True})
class _Inputs(serializers.JSONField):
    """A run's inputs: an object, checked against the pipeline's ``input_schema``."""


class RunStartInput(serializers.Serializer):
    refuses_unknown_fields = True
    inputs = _Inputs(
        required=False, default=dict, help_text="the pipeline's inputs, checked strictly against its schema"
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # A misspelt key (``input``) must not start a run with every default.
        unknown = sorted(set(self.initial_data) - set(self.fields)) if isinstance(self.initial_data, dict) else []
        if unknown:
            raise serializers.ValidationError({name: ["unknown field; a start takes inputs"] for name in unknown})
        return attrs
