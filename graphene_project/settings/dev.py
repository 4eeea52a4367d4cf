"""Development and embedded mode: the default for ``manage.py`` and ``graphene up``."""

from graphene_project.settings.base import *  # noqa: F403
from graphene_project.settings.env import env

DEBUG = env.boolean("GRAPHENE_DEBUG", True)
# The examples and the demo's tour declare test.sleep/test.flaky records (see base.py).
GRAPHENE_TEST_KINDS = env.boolean("GRAPHENE_TEST_KINDS", True)
