from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.api.strict import StrictInput
from apps.pipelines.causes import cause_of, cause_text
from apps.pipelines.models import (
    JournalEntry,
    Pipeline,
    PipelineEvent,
    Revision,
    Run,
    RunEvent,
    Source,
    Trigger,
    TriggerEvent,
)
from apps.pipelines.services.triggers import trigger_summary


class PipelineOutput(serializers.ModelSerializer):
    revision = serializers.SerializerMethodField(
        help_text="the digest of the active revision (what new runs start on); null: installed on the workers"
    )

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
            "revision",
            "updated_at",
        ]
        read_only_fields = fields

    def get_revision(self, obj: Pipeline) -> str | None:
        return obj.revision.digest if obj.revision_id is not None and obj.revision is not None else None


class RevisionOutput(serializers.ModelSerializer):
    """An immutable revision of pipeline code: its digest, where it came from, what it defines."""

    # The source's name (a git source), null for a pushed directory. DRF takes declared fields off
    # the class, so this does not shadow Field.source at runtime, only for mypy.
    source = serializers.CharField(  # type: ignore[assignment]
        source="source.name", read_only=True, allow_null=True, default=None
    )
    created_by = serializers.SerializerMethodField()
    pipelines = serializers.SerializerMethodField(help_text="the names of the pipelines it defines")

    class Meta:
        model = Revision
        fields = [
            "id",
            "digest",
            "namespace",
            "size",
            "source",
            "commit",
            "pipelines",
            "manifest",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields

    def get_created_by(self, obj: Revision) -> str | None:
        return obj.created_by.get_username() if obj.created_by_id and obj.created_by else None

    def get_pipelines(self, obj: Revision) -> list[str]:
        return obj.pipeline_names()


class PushOutput(RevisionOutput):
    created = serializers.SerializerMethodField(help_text="false: the namespace had a revision of these files")
    activated = serializers.SerializerMethodField(help_text="the pipelines this push made active")

    class Meta(RevisionOutput.Meta):
        fields = [*RevisionOutput.Meta.fields, "created", "activated"]
        read_only_fields = fields

    def get_created(self, obj: Revision) -> bool:
        return bool(self.context["created"])

    def get_activated(self, obj: Revision) -> list[str]:
        return list(self.context["activated"])


class PipelineEventOutput(serializers.ModelSerializer):
    """A delivery event of a pipeline: an activation or a rollback, by whom."""

    actor = serializers.SerializerMethodField()

    class Meta:
        model = PipelineEvent
        fields = ["id", "reason", "message", "data", "actor", "created_at"]
        read_only_fields = fields

    def get_actor(self, obj: PipelineEvent) -> str | None:
        return obj.actor.get_username() if obj.actor_id and obj.actor else None


class ActivateInput(StrictInput):
    revision = serializers.CharField(max_length=80, help_text="a revision's id or at least 7 digits of its digest")


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
    revision = serializers.SerializerMethodField(
        help_text="the digest of the revision the run executes and replays; null: code installed on the workers"
    )
    cause = serializers.SerializerMethodField(
        help_text="why it started: {type: user|parent|upstream|cron|webhook|system, ...} (docs/triggers.md)"
    )
    cause_text = serializers.SerializerMethodField(help_text="the cause in one line")

    class Meta:
        model = Run
        fields = [
            "id",
            "pipeline",
            "namespace",
            "number",
            "revision",
            "status",
            "record",
            "parent",
            "parent_name",
            "cause",
            "cause_text",
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

    def get_revision(self, obj: Run) -> str | None:
        return obj.revision.digest if obj.revision_id is not None and obj.revision is not None else None

    @extend_schema_field({"type": "object", "additionalProperties": True})
    def get_cause(self, obj: Run) -> dict[str, Any]:
        return cause_of(obj)

    def get_cause_text(self, obj: Run) -> str:
        return cause_text(cause_of(obj))


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


class RunStartInput(StrictInput):
    inputs = _Inputs(
        required=False, default=dict, help_text="the pipeline's inputs, checked strictly against its schema"
    )
    revision = serializers.CharField(
        required=False,
        max_length=80,
        help_text="a draft start: this revision (id or digest prefix) instead of the pipeline's active one",
    )


class PlanInput(StrictInput):
    inputs = _Inputs(
        required=False, default=dict, help_text="the pipeline's inputs, checked strictly against its schema"
    )
    revision = serializers.CharField(
        required=False,
        max_length=80,
        help_text="plan this revision (id or digest prefix) instead of the pipeline's active one (a draft)",
    )


class PlanOutput(serializers.Serializer[Any]):
    """What a run would do, recorded without doing it (docs/pipelines.md, "Plans")."""

    pipeline = serializers.CharField()
    namespace = serializers.CharField()
    revision = serializers.CharField(
        allow_null=True, help_text="the digest of the revision planned; null: code installed on the workers"
    )
    inputs = serializers.JSONField(help_text="the inputs as validated (defaults filled in), as a start stores them")
    complete = serializers.BooleanField(
        help_text="false: the plan stopped early (it needed a value read from outside, or grew too long)"
    )
    stopped = serializers.JSONField(
        allow_null=True, help_text="why and where the plan stopped: {reason, where (file:line), placeholder}"
    )
    entries = serializers.ListField(
        child=serializers.JSONField(),
        help_text="the calls the run would make, in order: {seq, run, op, ...}; op is declare, ready, step, run, "
        "exec, put_file, get_file, call, to_stand, delete, sleep, log, assume, attach, attach_agent, "
        "select_agents, agent_install, publish_capability, publish_artifact or attach_artifact; `uses` names "
        "the entries whose values it reads",
    )
    tree = serializers.ListField(
        child=serializers.JSONField(),
        help_text="the run, then the stands, each {ref, kind, name, children}: the records they would own when "
        "the code returns (child runs under their run)",
    )
    output = serializers.JSONField(allow_null=True, help_text="what the pipeline would return (with placeholders)")


class SourceOutput(serializers.ModelSerializer):
    """A git source: where a namespace's pipeline code comes from, and what it synced last."""

    revision = serializers.SerializerMethodField(help_text="the digest of the revision synced last; null: none yet")
    created_by = serializers.SerializerMethodField()

    class Meta:
        model = Source
        fields = [
            "id",
            "name",
            "namespace",
            "url",
            "ref",
            "subdirectory",
            "credential",
            "activate",
            "commit",
            "revision",
            "synced_at",
            "error",
            "error_at",
            "created_by",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields
        extra_kwargs = {"credential": {"help_text": "the name of the secret holding the token (never its value)"}}

    def get_revision(self, obj: Source) -> str | None:
        return obj.revision.digest if obj.revision_id is not None and obj.revision is not None else None

    def get_created_by(self, obj: Source) -> str | None:
        return obj.created_by.get_username() if obj.created_by_id and obj.created_by else None


class _String(serializers.CharField):
    """A JSON string, nothing else (DRF's CharField would turn 5 or true into "5", "True")."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class _Boolean(serializers.BooleanField):
    """``true`` or ``false``, nothing else (DRF's BooleanField takes "yes", 1, "on")."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class _SourceSettings(StrictInput):
    """The settings of a source, as POST, PUT and PATCH take them (checked by the service)."""

    # Not trimmed: a blank in a URL or a ref is refused, saying so, rather than dropped.
    url = _String(
        max_length=1000,
        trim_whitespace=False,
        help_text="the repository: http(s)://, git://, ssh:// or file://, no credentials in it",
    )
    ref = _String(max_length=255, trim_whitespace=False, help_text="a branch, a tag, a full ref or a full commit sha")
    subdirectory = _String(
        max_length=500,
        required=False,
        allow_blank=True,
        default="",
        trim_whitespace=False,
        help_text="the directory of the repository that holds the code (default: its root)",
    )
    credential = _String(
        max_length=253,
        required=False,
        allow_blank=True,
        default="",
        trim_whitespace=False,
        help_text="the name of a secret of the namespace holding a token or password (http(s) only)",
    )
    activate = _Boolean(
        required=False, default=True, help_text="a new revision's pipelines become active at once (default true)"
    )


class SourceApplyInput(_SourceSettings):
    name = _String(max_length=63, trim_whitespace=False, help_text="the source's name in its namespace (a DNS label)")


class SourceChangeInput(_SourceSettings):
    """PUT: every setting (those left out take their defaults); PATCH: those given."""


class SourceSyncOutput(SourceOutput):
    """The source after a sync, with what the sync did."""

    new = serializers.SerializerMethodField(
        help_text="false: the ref still names the commit synced last, and nothing was exported"
    )
    revision_created = serializers.SerializerMethodField(
        help_text="a revision was made (false: the namespace had one of the same files)"
    )
    activated = serializers.SerializerMethodField(help_text="the pipelines this sync made active")
    pipelines = serializers.SerializerMethodField(help_text="the pipelines the revision defines")

    class Meta(SourceOutput.Meta):
        fields = [*SourceOutput.Meta.fields, "new", "revision_created", "activated", "pipelines"]
        read_only_fields = fields

    def get_new(self, obj: Source) -> bool:
        return bool(self.context["new"])

    def get_revision_created(self, obj: Source) -> bool:
        return bool(self.context["created"])

    def get_activated(self, obj: Source) -> list[str]:
        return list(self.context["activated"])

    def get_pipelines(self, obj: Source) -> list[str]:
        return obj.revision.pipeline_names() if obj.revision is not None else []


class TriggerOutput(serializers.ModelSerializer):
    """A trigger of a pipeline, as its code declares it, with its state."""

    pipeline = serializers.CharField(source="pipeline.name", read_only=True)
    summary = serializers.SerializerMethodField(help_text="the trigger in one line")
    paused_by = serializers.SerializerMethodField()
    last_run = serializers.UUIDField(source="last_run_id", read_only=True, allow_null=True)
    hook_path = serializers.SerializerMethodField(help_text="where a webhook trigger takes deliveries; null otherwise")

    class Meta:
        model = Trigger
        fields = [
            "id",
            "pipeline",
            "namespace",
            "name",
            "type",
            "summary",
            "spec",
            "paused",
            "paused_by",
            "paused_at",
            "next_fire_at",
            "last_fired_at",
            "last_run",
            "hook_path",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_summary(self, obj: Trigger) -> str:
        return trigger_summary(obj.spec)

    def get_paused_by(self, obj: Trigger) -> str | None:
        return obj.paused_by.get_username() if obj.paused_by_id and obj.paused_by else None

    def get_hook_path(self, obj: Trigger) -> str | None:
        return f"/hooks/{obj.pipeline.name}/{obj.name}" if obj.type == "webhook" else None


class TriggerEventOutput(serializers.ModelSerializer):
    actor = serializers.SerializerMethodField()
    run = serializers.UUIDField(source="run_id", read_only=True, allow_null=True)

    class Meta:
        model = TriggerEvent
        fields = ["id", "reason", "message", "data", "run", "actor", "created_at"]
        read_only_fields = fields

    def get_actor(self, obj: TriggerEvent) -> str | None:
        return obj.actor.get_username() if obj.actor_id and obj.actor else None
