"""Records in the Studio. The Studio's pages (``apps/studio/views/records.py``) take the
places and names of the stock change list and change form: the records list, a record's
inspector, the confirmation page of a subtree's deletion and the TTL and stand actions. No
stock form reaches a record's fields (the tree's internals included); every change goes
through the services, as over the API. Events are listed read-only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse

from apps.core.admin import AccessAdmin
from apps.records.models import Event, Record


@admin.register(Record)
class RecordAdmin(AccessAdmin):
    """Routes the model's admin URLs to the Studio's record pages. Reaching them takes the
    admin's view permission on records, as the stock pages did; each action then makes the
    API's own check (``record_get``) and calls the API's service."""

    # No stock add, change or delete (AccessAdmin's): records are declared through the API, SDK
    # or CLI, no form edits one, and deletion goes through the cascade (the Studio's delete page).

    def get_urls(self) -> list[URLPattern]:
        from apps.studio.views import records as pages

        site = self.admin_site

        def page(route: str, view: Callable[..., HttpResponse], name: str) -> URLPattern:
            def viewing(request: HttpRequest, **kwargs: Any) -> HttpResponse:
                if not self.has_view_permission(request):
                    raise PermissionDenied
                return view(request, **kwargs)

            return path(route, site.admin_view(viewing), name=name, kwargs={"site": site})

        def moved(request: HttpRequest, record_id: Any) -> HttpResponse:
            return HttpResponseRedirect(reverse("admin:records_record_change", args=[record_id], current_app=site.name))

        return [
            page("", pages.record_list, "records_record_changelist"),
            page("<uuid:record_id>/change/", pages.record_detail, "records_record_change"),
            page("<uuid:record_id>/delete/", pages.record_delete, "records_record_delete"),
            page("<uuid:record_id>/act/", pages.record_act, "records_record_act"),
            path("<uuid:record_id>/", site.admin_view(moved)),
        ]


@admin.register(Event)
class EventAdmin(AccessAdmin):
    list_display = ["created_at", "record", "type", "reason", "message"]
    list_filter = ["type"]
    search_fields = ["=record__id", "reason", "message"]
    list_select_related = ["record"]
    access_namespace_field = "record__namespace"
