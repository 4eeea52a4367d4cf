"""The Celery application. Tasks live in ``apps/<app>/tasks.py`` and carry only ids."""

import os

from celery import Celery
from celery.signals import task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "graphene_project.settings.dev")

app = Celery("graphene")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
@task_postrun.connect
def _recycle_db_connections(**_: object) -> None:
    """What Django does around each request (signal receivers justify themselves here: Celery
    offers no other hook around every task): drop connections that are broken or older than
    CONN_MAX_AGE, since Celery no longer closes them after each task (CELERY_DB_REUSE_MAX)."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        # Inside a transaction (an eagerly run task in a test, a task called from a service)
        # the connection is in use: leave it alone.
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()
