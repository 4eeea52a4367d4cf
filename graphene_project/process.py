"""Which Graphene process this is, for the settings that differ by process.

The database connections differ: the web process pools them, workers and beat keep theirs
(``graphene_project/settings/base.py``). The ``graphene`` command names its process before
Django loads the settings; an ASGI server that loads ``graphene_project.asgi`` itself (daphne,
uvicorn) is the web process. A process nobody named (``celery -A graphene_project worker``,
``manage.py``) gets what workers get. Once the settings are loaded the name is fixed: a module
that imports ``graphene_project.asgi`` later (a test) does not turn its process into a web one.
"""

from __future__ import annotations

from typing import Final

WEB: Final = "web"  # graphene web, or any ASGI server on graphene_project.asgi
UP: Final = "up"  # graphene up: web, worker and beat threads in one process
WORKER: Final = "worker"
BEAT: Final = "beat"
MANAGE: Final = "manage"

_name = ""


def declare(name: str) -> None:
    """Name this process, unless the settings are already loaded (then it is too late to matter)."""
    global _name
    from django.conf import settings

    if not settings.configured:
        _name = name


def current() -> str:
    """This process's name, or ``""`` when nobody named it."""
    return _name
