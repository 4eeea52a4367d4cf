"""The Studio's view of records: browsable as a tree, read-only; actions call services."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from mptt.admin import MPTTModelAdmin

from apps.records import services
from apps.records.models import Event, Record


class EventInline(admin.TabularInline):
    model = Event
    fields = readonly_fields = ("created_at", "type", "reason", "message", "data", "actor")
    extra = 0
    can_delete = False
    ordering = ["-id"]
    max_num = 0

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Record)
class RecordAdmin(MPTTModelAdmin):
    list_display = ["name", "kind", "phase", "expires_at", "updated_at", "id"]
    list_filter = ["phase", "kind", "namespace"]
    search_fields = ["name", "kind", "=id"]
    mptt_level_indent = 24
    inlines = [EventInline]
    actions = ["delete_subtree"]
    readonly_fields: list[str] = [f.name for f in Record._meta.fields]
    list_per_page = 100

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # records are declared through the API, SDK or CLI

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # deletion goes through the cascade (action below), never a raw row delete

    @admin.action(description="Delete selected records and their subtrees (children first)")
    def delete_subtree(self, request: HttpRequest, queryset: QuerySet[Record]) -> None:
        for record in queryset:
            services.record_delete_request(record=record, actor=request.user, reason="DeletedInStudio")
        messages.info(request, f"Deletion requested for {queryset.count()} record(s) and their subtrees.")


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "record", "type", "reason", "message"]
    list_filter = ["type"]
    search_fields = ["=record__id", "reason", "message"]
    list_select_related = ["record"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
