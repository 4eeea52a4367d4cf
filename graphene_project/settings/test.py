"""Settings for the test suite: real PostgreSQL and Redis, fast hashing, in-memory channels.

The defaults point at the services on their standard local ports (as CI and a developer
machine have them); every value can be overridden with the same ``GRAPHENE_*`` variables.
"""

import os
import tempfile
import uuid

os.environ.setdefault("GRAPHENE_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/graphene")
os.environ.setdefault("GRAPHENE_BROKER_URL", "redis://127.0.0.1:6379/14")
os.environ.setdefault("GRAPHENE_SECRET_KEY", "test-only-not-secret")
# Per test session: a private queue (stale workers of another session never take our tasks)
# and a private data directory. Worker processes started by the tests inherit both.
os.environ.setdefault("GRAPHENE_QUEUE", f"graphene-test-{uuid.uuid4().hex[:8]}")
os.environ.setdefault("GRAPHENE_DATA_DIR", tempfile.mkdtemp(prefix="graphene-test-"))
# Under pytest-xdist every xdist worker is a session of its own: it inherits the controller's
# values and makes them its own (queue, data directory, and so the test database's name and
# Docker scope), once; the processes its tests start inherit the result unchanged.
_XDIST = os.environ.get("PYTEST_XDIST_WORKER", "")
if _XDIST and os.environ.get("GRAPHENE_TEST_XDIST_WORKER") != _XDIST:
    os.environ["GRAPHENE_TEST_XDIST_WORKER"] = _XDIST
    os.environ["GRAPHENE_QUEUE"] = f"{os.environ['GRAPHENE_QUEUE']}{_XDIST}"
    _own = os.path.join(os.environ["GRAPHENE_DATA_DIR"], _XDIST)
    os.makedirs(_own, exist_ok=True)
    os.environ["GRAPHENE_DATA_DIR"] = _own
# Short leases so that crash tests see the reconciler pick up lost work within seconds.
os.environ.setdefault("GRAPHENE_OPERATION_LEASE_SECONDS", "3")
os.environ.setdefault("GRAPHENE_RUN_LEASE_SECONDS", "4")
# Cron instants more than 3 s late count as missed (tests stop the scheduler for a few seconds).
os.environ.setdefault("GRAPHENE_CRON_MISSED_AFTER_SECONDS", "3")
os.environ.setdefault("GRAPHENE_FIRING_RETRY_SECONDS", "2")
os.environ.setdefault("GRAPHENE_PIPELINE_MODULES", "tests.pipelines.sample")

# After the environment above (E402): base.py reads it on import.
from graphene_project.settings.base import *  # noqa: E402, F403
from graphene_project.settings.base import DATA_DIR  # noqa: E402
from graphene_project.settings.env import env  # noqa: E402

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# The worker processes the tests share publish their hints where the test web server listens
# (tests/harness: the Studio's live pages follow runs that shared workers execute), as workers
# and web share Redis in production. The test process itself keeps the in-memory layer.
if os.environ.get("GRAPHENE_TEST_CHANNEL_LAYER_URL"):
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": os.environ["GRAPHENE_TEST_CHANNEL_LAYER_URL"], "socket_timeout": 30}]},
        }
    }
GRAPHENE_RETRY_BASE_SECONDS = 0.2
GRAPHENE_RETRY_MAX_SECONDS = 2.0
GRAPHENE_FILE_ROOT = DATA_DIR / "test-files"
# The suite's records are mostly test.sleep/test.flaky objects (see base.py).
GRAPHENE_TEST_KINDS = env.boolean("GRAPHENE_TEST_KINDS", True)
# A test database per session, so that concurrent test runs on one machine never collide.
DATABASES["default"]["TEST"] = {"NAME": f"test_graphene_{os.environ['GRAPHENE_QUEUE'].rsplit('-', 1)[-1]}"}  # noqa: F405
