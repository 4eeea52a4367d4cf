"""Request bodies that refuse fields they do not know: a misspelt option (``timout``,
``subdir``, ``vaule``) is a 400 naming it, never dropped silently to leave a default in its
place. The schema says so too (``refuses_unknown_fields``: ``additionalProperties: false``,
apps/api/schema.py)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class StrictInput(serializers.Serializer[Any]):
    refuses_unknown_fields = True

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(self.initial_data) - set(self.fields)) if isinstance(self.initial_data, dict) else []
        if unknown:
            raise serializers.ValidationError(
                {name: [f"unknown field; fields are {sorted(self.fields)}"] for name in unknown}
            )
        return attrs
