"""Development and embedded mode: the default for ``manage.py`` and ``graphene up``."""

from graphene_project.settings.base import *  # noqa: F403
from graphene_project.settings.env import env

DEBUG = env.boolean("GRAPHENE_DEBUG", True)
