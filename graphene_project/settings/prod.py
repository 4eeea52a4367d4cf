"""Production: PostgreSQL, a real broker and channel layer, separate web/worker/beat processes.

Fails closed: without a secret key, a database and a broker it refuses to boot rather than
falling back to the embedded defaults.
"""

from graphene_project.settings.env import env

env.required("GRAPHENE_SECRET_KEY", "production needs a long random secret key")
env.required("GRAPHENE_DATABASE_URL", "production needs PostgreSQL, e.g. postgresql://graphene:pw@db:5432/graphene")
env.required("GRAPHENE_BROKER_URL", "production needs a broker, e.g. redis://redis:6379/0")
env.required("GRAPHENE_CHANNEL_LAYER_URL", "production needs a Redis channel layer, e.g. redis://redis:6379/1")
env.required(
    "GRAPHENE_SECRETS_KEY",
    "production needs a key for the secret store (apps.secrets), separate from GRAPHENE_SECRET_KEY, e.g. "
    "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'",
)

from graphene_project.settings.base import *  # noqa: E402, F403

DEBUG = False
SECURE_SSL_REDIRECT = env.boolean("GRAPHENE_SECURE_SSL_REDIRECT", True)
# Health probes come over plain HTTP from the orchestrator.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = env.integer("GRAPHENE_HSTS_SECONDS", 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.boolean("GRAPHENE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env.boolean("GRAPHENE_HSTS_PRELOAD", True)
