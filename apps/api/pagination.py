from rest_framework.pagination import CursorPagination


class NewestFirst(CursorPagination):
    """Stable cursor pages (no skipped or repeated rows while records are inserted)."""

    ordering = ("-created_at", "-id")
    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 1000


class OldestFirstById(CursorPagination):
    """Append-only streams (events): ``?cursor=`` pages forward in insertion order."""

    ordering = ("id",)
    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 1000
