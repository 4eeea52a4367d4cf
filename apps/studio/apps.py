"""The Studio: Django's admin, as the place an engineer sees and drives runs, records, stands
and agents. ``StudioAdminConfig`` replaces ``django.contrib.admin`` in ``INSTALLED_APPS`` so
that every app's ``admin.py`` registers on the Studio's site; ``StudioConfig`` holds the
Studio's own pages, templates and static files (listed before it, so its templates win)."""

from django.apps import AppConfig
from django.contrib.admin.apps import AdminConfig


class StudioConfig(AppConfig):
    name = "apps.studio"
    label = "studio"
    verbose_name = "Studio"


class StudioAdminConfig(AdminConfig):
    default_site = "apps.studio.site.StudioSite"
