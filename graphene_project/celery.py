"""The Celery application. Tasks live in ``apps/<app>/tasks.py`` and carry only ids."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "graphene_project.settings.dev")

app = Celery("graphene")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
