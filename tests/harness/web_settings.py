"""Settings for the web processes the system tests start: the test settings, plus the Redis
channel layer, so that commands submitted by the test process reach the gateway's consumers
(the test settings force the in-memory layer, which a second process cannot share)."""

import os

from graphene_project.settings.env import env
from graphene_project.settings.test import *  # noqa: F403

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # socket_timeout: see the agents block of settings/base.py (redis-py >= 8 vs BZPOPMIN).
        "CONFIG": {
            "hosts": [
                {
                    "address": os.environ.get("GRAPHENE_TEST_AGENTS_CHANNEL_LAYER_URL", "redis://127.0.0.1:6379/13"),
                    "socket_timeout": 30,
                }
            ]
        },
    }
}
GRAPHENE_AGENT_HEARTBEAT_SECONDS = 1
# The session's shared web server hears every test of the session from 127.0.0.1, refusals
# included (a bad token, a 4401): its limit of failed authentications is out of their way. A
# test of the limit starts a server of its own with the limit it tests (WebServer(..., env)).
GRAPHENE_AUTH_FAILURES_PER_MINUTE = env.integer("GRAPHENE_AUTH_FAILURES_PER_MINUTE", 100_000)
GRAPHENE_AGENT_DISCONNECT_GRACE_SECONDS = 2
