"""Artifacts over REST: the record, shaped as an artifact (name, digest, size, where it came from)."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from rest_framework import serializers

from apps.records.models import Record


class ArtifactOutput(serializers.ModelSerializer[Record]):
    """An artifact's metadata; ``content_url`` downloads the bytes."""

    record_name = serializers.CharField(source="name", read_only=True)
    name = serializers.SerializerMethodField()
    sha256 = serializers.SerializerMethodField()
    size = serializers.SerializerMethodField()
    content_type = serializers.SerializerMethodField()
    owner = serializers.UUIDField(source="parent_id", allow_null=True, read_only=True)
    created_by_run = serializers.UUIDField(source="created_by_run_id", allow_null=True, read_only=True)
    pipeline = serializers.SerializerMethodField()
    content_url = serializers.SerializerMethodField()

    class Meta:
        model = Record
        fields = [
            "id",
            "namespace",
            "name",
            "sha256",
            "size",
            "content_type",
            "phase",
            "owner",
            "created_by_run",
            "pipeline",
            "labels",
            "expires_at",
            "record_name",
            "created_at",
            "updated_at",
            "content_url",
        ]
        read_only_fields = fields

    def get_name(self, obj: Record) -> str:
        return str(obj.spec.get("name", ""))

    def get_sha256(self, obj: Record) -> str:
        return str(obj.spec.get("sha256", ""))

    def get_size(self, obj: Record) -> int:
        return int(obj.spec.get("size", 0))

    def get_content_type(self, obj: Record) -> str:
        return str(obj.spec.get("content_type") or "application/octet-stream")

    def get_pipeline(self, obj: Record) -> str | None:
        value: Any = getattr(obj, "pipeline_name", None)
        return str(value) if value else None

    def get_content_url(self, obj: Record) -> str:
        path = reverse("artifact-content", kwargs={"pk": str(obj.pk)})
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request is not None else path
