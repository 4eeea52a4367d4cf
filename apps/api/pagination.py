"""Every list of the API is paged the same way: ``{"next", "previous", "results"}``, stable cursors,
``?limit=`` (1 to 1000; more is served as 1000) and ``?cursor=`` from a ``next``/``previous``
link. A malformed ``limit`` or ``cursor`` is a 400 naming it, never silently ignored."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from rest_framework.exceptions import NotFound
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request

from apps.core import validation
from apps.core.errors import ValidationFailed

# An upper bound for ``limit`` as text: larger numbers are still served as ``max_page_size``.
_LIMIT_CEILING = 10**9


def _bad_cursor() -> ValidationFailed:
    return ValidationFailed(
        "cursor is not one this list gave out: follow the next and previous links as they are",
        fields={"cursor": ["not a cursor of this list"]},
    )


class Paged(CursorPagination):
    """Stable cursor pages (no skipped or repeated rows while rows are inserted)."""

    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 1000

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param or "limit")
        if raw == "":  # ``?limit=``: a number was meant and is missing
            raise ValidationFailed(
                "limit= is empty: give a number of rows, or leave limit out", fields={"limit": ["empty"]}
            )
        size = validation.parse_int(raw, field="limit", default=self.page_size or 100, lo=1, hi=_LIMIT_CEILING)
        return min(size, self.max_page_size or size)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        """``cursor`` and ``limit`` as the server takes them (drf-spectacular reads this)."""
        return [
            {
                "name": self.cursor_query_param,
                "required": False,
                "in": "query",
                "description": "a cursor from a next or previous link, as it is",
                "schema": {"type": "string"},
            },
            {
                "name": self.page_size_query_param or "limit",
                "required": False,
                "in": "query",
                "description": f"rows per page (default {self.page_size}; more than {self.max_page_size} is "
                f"served as {self.max_page_size})",
                "schema": {"type": "integer", "minimum": 1, "maximum": _LIMIT_CEILING},
            },
        ]

    def decode_cursor(self, request: Request) -> Cursor | None:
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise _bad_cursor() from None

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> list[Any] | None:
        cursor = self.decode_cursor(request)
        if cursor is not None and cursor.position is not None and isinstance(queryset, QuerySet):
            # The position is compared with the ordering's first field: a value that field
            # cannot hold would fail in the database, so it is refused here.
            ordering = self.get_ordering(request, queryset, view)
            try:
                field = queryset.model._meta.get_field(ordering[0].lstrip("-"))
                value = field.to_python(cursor.position)
                if isinstance(value, int) and not -(2**63) <= value < 2**63:
                    raise ValueError("beyond a bigint")
            except FieldDoesNotExist:
                pass  # an annotation: the database judges it
            except (DjangoValidationError, ValueError, TypeError, OverflowError):
                raise _bad_cursor() from None
        return super().paginate_queryset(queryset, request, view)


class NewestFirst(Paged):
    """Newest first: runs, records, agents, artifacts."""

    ordering = ("-created_at", "-id")


class OldestFirstById(Paged):
    """Append-only streams (events, logs): ``?cursor=`` pages forward in insertion order."""

    ordering = ("id",)


class ByName(Paged):
    """Named things in name order: pipelines, secrets."""

    ordering = ("name",)
