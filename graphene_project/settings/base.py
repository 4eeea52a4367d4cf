"""Settings shared by every mode.

Mode selection: with no ``GRAPHENE_DATABASE_URL`` / ``GRAPHENE_BROKER_URL`` /
``GRAPHENE_CHANNEL_LAYER_URL`` Graphene runs *embedded*: a SQLite file under
``GRAPHENE_DATA_DIR``, the in-memory broker and channel layer, and worker and beat
threads inside the server process. Setting them selects PostgreSQL, Redis/RabbitMQ and
the Redis channel layer (production mode, separate web/worker/beat processes).
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from pathlib import Path

from celery.schedules import schedule
from django.core.exceptions import ImproperlyConfigured

from graphene_project import process
from graphene_project.settings.env import (
    check_broker_url,
    check_redis_url,
    database_from_url,
    env,
    pool_options,
    trusted_networks,
)

BASE_DIR = Path(__file__).resolve().parent.parent.parent

DATA_DIR = Path(env.string("GRAPHENE_DATA_DIR", str(BASE_DIR / ".graphene")) or "").expanduser().resolve()

DATABASE_URL = env.string("GRAPHENE_DATABASE_URL")
BROKER_URL = env.string("GRAPHENE_BROKER_URL")
CHANNEL_LAYER_URL = env.string("GRAPHENE_CHANNEL_LAYER_URL")

# Embedded: no broker configured, so tasks travel through kombu's in-process transport and
# must be executed by a worker thread inside the same process (``graphene up``).
GRAPHENE_EMBEDDED = BROKER_URL is None


def _secret_key_file() -> str:
    """A per-installation key kept in the data directory (dev/embedded only; prod requires one)."""
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = env.string("GRAPHENE_SECRET_KEY") or _secret_key_file()
DEBUG = env.boolean("GRAPHENE_DEBUG", False)
ALLOWED_HOSTS = env.csv("GRAPHENE_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.csv("GRAPHENE_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    # The Studio first: its templates override the admin's. Its admin config replaces
    # django.contrib.admin, so that every admin.py registers on the Studio's site.
    "apps.studio.apps.StudioConfig",
    "apps.studio.apps.StudioAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files for /api/docs/ (no CDN)
    "mptt",
    "channels",
    "apps.core",
    "apps.accounts",
    "apps.records",
    "apps.pipelines",
    "apps.observability",
    "apps.agents",
    "apps.secrets",
    "apps.artifacts",
    "apps.api",
]

MIDDLEWARE = [
    # First: the security headers and the Content-Security-Policy on every answer, the ones the
    # next middleware rewrites included (apps/core/security.py).
    "apps.core.security.SecurityHeadersMiddleware",
    # A request id for every request (X-Request-Id on every answer) and the audit context: who
    # acts, under which request (apps/core/audit.py).
    "apps.core.middleware.AuditContextMiddleware",
    # Refuses a path or query PostgreSQL cannot store, and gives every error under /api/ the
    # API's JSON shape, whatever made it (apps/api/middleware.py).
    "apps.api.middleware.ApiDoorMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Failed token authentications under /api/, limited per client address (apps/core/throttle.py).
    "apps.api.middleware.AuthFailureThrottleMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # A view that waited the pool's timeout for a database connection answers 503 (the web's pool).
    "apps.core.middleware.DatabaseBusyMiddleware",
]

# --- Security headers (apps/core/security.py) ----------------------------------------------------
# Django's defaults, stated: every answer carries them (static files too). HSTS is set in
# production (prod.py) and sent on secure requests only.
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

# --- Failed authentications (apps/core/throttle.py) -------------------------------------------------
# Failed logins at the Studio's form (per client address and per username) and failed token
# authentications (per client address) allowed in a minute; past it, 429 until the minute
# ends. 0 turns the limit off. The counts live in the cache below.
GRAPHENE_AUTH_FAILURES_PER_MINUTE = env.integer("GRAPHENE_AUTH_FAILURES_PER_MINUTE", 10)

ROOT_URLCONF = "graphene_project.urls"
# Under /api/ a failed CSRF check answers in the API's JSON error shape (the Studio's stays HTML).
CSRF_FAILURE_VIEW = "apps.api.errors.csrf_failure"
ASGI_APPLICATION = "graphene_project.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Which process this is (graphene_project/process.py): web, up, worker, beat, manage, or "".
GRAPHENE_PROCESS = process.current()
# The web process's database connections. Under ASGI each request's synchronous code runs on a
# thread of its own, with a connection of its own: kept open (CONN_MAX_AGE), they piled up with
# the threads until PostgreSQL refused new clients (Django advises against persistent
# connections under ASGI). So the web borrows connections from a pool of at most
# GRAPHENE_WEB_DB_POOL_MAX (psycopg_pool, through Django) and gives each back when its request
# ends. A request that finds them all in use waits up to the timeout, then answers 503
# (apps/core/middleware.py); /readyz shows the pool's state. Workers and beat run a few
# long-lived threads each and keep their connections (?conn_max_age= of the URL, default 60 s);
# every worker process that executes tasks (each prefork pool child) also holds one for its
# heartbeat (apps/core/workers.py). Size it so that web replicas x GRAPHENE_WEB_DB_POOL_MAX plus
# workers' and beat's connections stay below PostgreSQL's max_connections.
GRAPHENE_WEB_DB_POOL_MAX = env.integer("GRAPHENE_WEB_DB_POOL_MAX", 20)
# Connections kept open while idle (default 2, or the bound when it is lower).
GRAPHENE_WEB_DB_POOL_MIN = env.integer("GRAPHENE_WEB_DB_POOL_MIN", min(2, GRAPHENE_WEB_DB_POOL_MAX))
GRAPHENE_WEB_DB_POOL_TIMEOUT_SECONDS = env.integer("GRAPHENE_WEB_DB_POOL_TIMEOUT_SECONDS", 10)
# Checked in every process, so that a wrong bound shows before the web starts with it.
_WEB_POOL = pool_options(
    min_size=GRAPHENE_WEB_DB_POOL_MIN,
    max_size=GRAPHENE_WEB_DB_POOL_MAX,
    timeout=GRAPHENE_WEB_DB_POOL_TIMEOUT_SECONDS,
    name="graphene-web",
)

if DATABASE_URL:
    DATABASES = {
        "default": database_from_url(DATABASE_URL, pool=_WEB_POOL if GRAPHENE_PROCESS == process.WEB else None)
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "graphene.sqlite3",
            # Worker and beat threads write concurrently with the web thread: WAL lets readers
            # proceed, IMMEDIATE takes the write lock up front (no upgrade deadlocks), and the
            # timeout makes writers queue instead of failing with "database is locked".
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"

# --- Celery ------------------------------------------------------------------------------
CELERY_BROKER_URL = check_broker_url(BROKER_URL) if BROKER_URL else "memory://localhost/"
CELERY_RESULT_BACKEND = None  # the database rows are the results; the queue is only delivery
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True  # a worker killed mid-task leaves the message for another worker
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = env.string("GRAPHENE_QUEUE", "graphene") or "graphene"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Celery's Django fix-up closes every database connection before and after each task unless
# this is set (it ignores CONN_MAX_AGE), so each task paid for a new PostgreSQL session
# (~10 % of a run's execution time). Connections are kept; close_old_connections() around each
# task (graphene_project/celery.py) still retires broken ones and those past CONN_MAX_AGE.
CELERY_DB_REUSE_MAX = 1_000_000
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "records-expire": {"task": "apps.records.tasks.records_expire_task", "schedule": schedule(timedelta(seconds=5))},
    "records-deletion-reconcile": {
        "task": "apps.records.tasks.records_reconcile_task",
        "schedule": schedule(timedelta(seconds=15)),
    },
    "records-purge-tombstones": {
        "task": "apps.records.tasks.records_purge_task",
        "schedule": schedule(timedelta(hours=1)),
    },
    "runs-recover": {"task": "apps.pipelines.tasks.runs_recover_task", "schedule": schedule(timedelta(seconds=5))},
    "agents-mark-lost": {
        "task": "apps.agents.tasks.agents_mark_lost_task",
        "schedule": schedule(timedelta(seconds=10)),
    },
    "records-observe-due": {
        "task": "apps.records.tasks.records_observe_due_task",
        "schedule": schedule(timedelta(seconds=env.integer("GRAPHENE_OBSERVE_TICK_SECONDS", 2))),
    },
    "records-sweep-orphans": {
        "task": "apps.records.tasks.records_sweep_task",
        "schedule": schedule(timedelta(minutes=10)),
    },
    # Cron triggers' instants, and firings whose process died before starting their run.
    "triggers-tick": {
        "task": "apps.pipelines.tasks.triggers_tick_task",
        "schedule": schedule(timedelta(seconds=env.integer("GRAPHENE_TRIGGERS_TICK_SECONDS", 1))),
    },
}

# --- Channels ----------------------------------------------------------------------------
if CHANNEL_LAYER_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # channels_redis waits up to 5 s (BZPOPMIN) for a consumer's next message, and
            # redis-py >= 8 times socket reads out after 5 s by default: an idle consumer (an
            # agent's connection between commands) would die with "Timeout reading from redis".
            "CONFIG": {
                "hosts": [
                    {
                        "address": check_redis_url(CHANNEL_LAYER_URL, setting="GRAPHENE_CHANNEL_LAYER_URL"),
                        "socket_timeout": 30,
                    }
                ]
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- Cache ---------------------------------------------------------------------------------------
# Shared by every web process in production (the failed-authentication counts): Redis, at
# GRAPHENE_CACHE_URL or else the channel layer's Redis (the cache's keys are prefixed and
# expire). Embedded (one process): in memory.
CACHE_URL = env.string("GRAPHENE_CACHE_URL") or CHANNEL_LAYER_URL
if CACHE_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": check_redis_url(CACHE_URL, setting="GRAPHENE_CACHE_URL"),
            "KEY_PREFIX": "graphene-cache",
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- REST API ----------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # API tokens (apps/accounts): hashed at rest, expiring, revocable; Token or Bearer.
        "apps.accounts.authentication.AccessTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Every view names its access rules; apps/core/access.py decides (apps/api/permissions.py).
    "DEFAULT_PERMISSION_CLASSES": ["apps.api.permissions.AccessPermission"],
    "DEFAULT_SCHEMA_CLASS": "apps.api.schema.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "apps.api.errors.exception_handler",
    # Bounded parsers (apps/api/parsers.py): size, depth and storable values checked at the door.
    # Bodies are JSON (anything else is a 415); only an artifact upload takes multipart, its own.
    "DEFAULT_PARSER_CLASSES": ["apps.api.parsers.JSONParser"],
    # ?limit= is checked by the paginators (apps/api/pagination.py): a malformed one is a 400.
}
# How many levels of objects and arrays a JSON document may nest (a request body, run inputs,
# a record's spec or labels); deeper is a 400 before anything parses it.
GRAPHENE_API_MAX_JSON_DEPTH = env.integer("GRAPHENE_API_MAX_JSON_DEPTH", 64)
# The largest request body the API and the Studio read into memory (JSON and form bodies), in
# bytes; larger is a 413. Artifact uploads are streamed and bounded by GRAPHENE_ARTIFACT_MAX_BYTES.
GRAPHENE_API_MAX_BODY_BYTES = env.integer("GRAPHENE_API_MAX_BODY_BYTES", 10 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = GRAPHENE_API_MAX_BODY_BYTES
SPECTACULAR_SETTINGS = {
    "TITLE": "Graphene API",
    "DESCRIPTION": "Records, runs and the resources they own.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "COMPONENT_SPLIT_REQUEST": True,
    # One name for a choice set used by several fields (a run's status, and a status event's from/to).
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "apps.pipelines.choices.RunStatus",
        "TokenStatusEnum": "apps.accounts.choices.TokenStatus",
    },
    # Every operation declares its error answers in the API's one shape (apps/api/schema.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "apps.api.schema.error_responses",
    ],
    # /api/docs/ serves Swagger UI from drf-spectacular-sidecar's files, not a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Graphene ----------------------------------------------------------------------------
# How long tombstones of deleted records (with their events) are kept before purging.
GRAPHENE_TOMBSTONE_RETENTION = timedelta(days=env.integer("GRAPHENE_TOMBSTONE_RETENTION_DAYS", 7))
# Base and cap of the exponential backoff between failed deletes/creates of one record.
GRAPHENE_RETRY_BASE_SECONDS = float(env.integer("GRAPHENE_RETRY_BASE_MS", 1000)) / 1000
GRAPHENE_RETRY_MAX_SECONDS = float(env.integer("GRAPHENE_RETRY_MAX_MS", 300_000)) / 1000
# Where the built-in ``file`` kind may create files (paths are resolved under this root).
GRAPHENE_FILE_ROOT = Path(env.string("GRAPHENE_FILE_ROOT", str(DATA_DIR / "files")) or "")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.string("GRAPHENE_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "INFO"}, "celery": {"level": "WARNING"}},
}
# Load the test kinds (test.sleep, test.flaky: objects in a directory, with delays and injected
# failures, kinds/testing.py), which the test suite, the examples and the demo use. Off here
# and in production; on in the development/embedded and test settings.
GRAPHENE_TEST_KINDS = env.boolean("GRAPHENE_TEST_KINDS", False)
# Where the test.sleep/test.flaky kinds keep their objects (one folder per record).
GRAPHENE_TEST_WORLD_DIR = Path(env.string("GRAPHENE_TEST_WORLD_DIR", str(DATA_DIR / "test-world")) or "")
# Create attempts before a record settles in create_failed (PermanentError fails at once).
GRAPHENE_CREATE_ATTEMPTS = env.integer("GRAPHENE_CREATE_ATTEMPTS", 5)
# How long an operation may stay in flight before the reconciler re-enqueues it. An operation
# whose worker is lost (GRAPHENE_WORKER_HEARTBEAT_SECONDS below) is re-enqueued at once; this
# lease is the net for lost messages and for holders without a heartbeat.
GRAPHENE_OPERATION_LEASE_SECONDS = env.integer("GRAPHENE_OPERATION_LEASE_SECONDS", 120)
# The most records one deletion task takes (records whose children are all gone; siblings kept
# together; a frontier of more than half of this still goes to two tasks). Per-batch costs
# dominate cheap deletes (bench/cascade_delete.py, 2 cores): 100 gave 3,100-3,350 records/s,
# 200 3,500-4,100.
GRAPHENE_DELETE_BATCH = env.integer("GRAPHENE_DELETE_BATCH", 200)
# Drift: the scheduler claims at most this many due records per tick, in batches of this size.
GRAPHENE_OBSERVE_SCAN_LIMIT = env.integer("GRAPHENE_OBSERVE_SCAN_LIMIT", 5000)
GRAPHENE_OBSERVE_BATCH = env.integer("GRAPHENE_OBSERVE_BATCH", 200)
# Pipelines: Python modules to import, and directories whose *.py files define pipelines.
GRAPHENE_PIPELINE_MODULES = env.csv("GRAPHENE_PIPELINE_MODULES", [])
GRAPHENE_PIPELINE_DIRS = env.csv("GRAPHENE_PIPELINE_DIRS", [str(BASE_DIR / "examples" / "pipelines")])
# Revisions (pushed directories, git sources; docs/delivery.md): the largest source tree a
# revision may hold, in bytes (its files, unpacked); how long importing one to describe it may
# take; how many revisions a process keeps imported (the least recently used is forgotten);
# where processes unpack the revisions they load (a cache: rebuilt from the blob store).
GRAPHENE_REVISION_MAX_BYTES = env.integer("GRAPHENE_REVISION_MAX_BYTES", 50 * 1024**2)
GRAPHENE_REVISION_DESCRIBE_TIMEOUT_SECONDS = env.integer("GRAPHENE_REVISION_DESCRIBE_TIMEOUT_SECONDS", 60)
GRAPHENE_REVISION_CACHE_SIZE = env.integer("GRAPHENE_REVISION_CACHE_SIZE", 16)
GRAPHENE_REVISION_DIR = Path(env.string("GRAPHENE_REVISION_DIR", str(DATA_DIR / "revisions")) or "")
# Plans (docs/pipelines.md, "Plans"): how long a plan's recording pass, which imports the code
# and runs the pipeline's function in a fresh process, may take before it is stopped.
GRAPHENE_PLAN_TIMEOUT_SECONDS = env.integer("GRAPHENE_PLAN_TIMEOUT_SECONDS", 20)
# Triggers (docs/triggers.md): how often the scheduler looks for cron instants (each is then
# fired at its exact time by a worker); how late an instant may fire before it counts as missed
# (the scheduler was down: the trigger's ``missed`` policy decides); how long a firing may wait
# for its run before the tick starts it (its process died); the largest webhook body, in bytes.
GRAPHENE_TRIGGERS_TICK_SECONDS = env.integer("GRAPHENE_TRIGGERS_TICK_SECONDS", 1)
GRAPHENE_CRON_MISSED_AFTER_SECONDS = env.integer("GRAPHENE_CRON_MISSED_AFTER_SECONDS", 30)
GRAPHENE_FIRING_RETRY_SECONDS = env.integer("GRAPHENE_FIRING_RETRY_SECONDS", 5)
GRAPHENE_WEBHOOK_MAX_BYTES = env.integer("GRAPHENE_WEBHOOK_MAX_BYTES", 5 * 1024**2)
# A worker executing a run renews its lease every third of this. A run whose worker is lost
# (below) is resumed elsewhere at once; this expiry is the net for a holder without a heartbeat.
GRAPHENE_RUN_LEASE_SECONDS = env.integer("GRAPHENE_RUN_LEASE_SECONDS", 30)
# Worker heartbeats (apps/core/workers.py, docs/records.md "Recovery"): every worker process
# refreshes its row this often (seconds); one whose database session has ended and that missed
# two beats, or that has not beaten for GRAPHENE_WORKER_LOST_SECONDS, is lost, and what it held
# (operations, run leases) is taken over by the other workers at once.
GRAPHENE_WORKER_HEARTBEAT_SECONDS = env.number("GRAPHENE_WORKER_HEARTBEAT_SECONDS", 1.0)
GRAPHENE_WORKER_LOST_SECONDS = env.number("GRAPHENE_WORKER_LOST_SECONDS", 10.0)
if not 0 < GRAPHENE_WORKER_HEARTBEAT_SECONDS * 3 <= GRAPHENE_WORKER_LOST_SECONDS:
    raise ImproperlyConfigured(
        f"GRAPHENE_WORKER_LOST_SECONDS={GRAPHENE_WORKER_LOST_SECONDS} must be at least three heartbeats "
        f"(GRAPHENE_WORKER_HEARTBEAT_SECONDS={GRAPHENE_WORKER_HEARTBEAT_SECONDS}), which must be positive"
    )

# --- Audit trail (apps/core/audit.py, docs/audit.md) ---------------------------------------
# How long audit rows are kept; the retention task deletes older ones once an hour, in batches.
GRAPHENE_AUDIT_RETENTION_DAYS = env.integer("GRAPHENE_AUDIT_RETENTION_DAYS", 365)
if GRAPHENE_AUDIT_RETENTION_DAYS < 1:
    raise ImproperlyConfigured(
        f"GRAPHENE_AUDIT_RETENTION_DAYS={GRAPHENE_AUDIT_RETENTION_DAYS}: keep the audit trail at least 1 day"
    )
CELERY_BEAT_SCHEDULE["audit-prune"] = {
    "task": "apps.core.tasks.audit_prune_task",
    "schedule": schedule(timedelta(hours=1)),
}

# --- Observability (apps.observability: /metrics, per-record series, traces) ----------------
# /metrics answers without a token (a scraper on a private network); off by default.
GRAPHENE_METRICS_PUBLIC = env.boolean("GRAPHENE_METRICS_PUBLIC", False)
# A bearer token a scraper may send instead of a user's API token (optional).
GRAPHENE_METRICS_TOKEN = env.string("GRAPHENE_METRICS_TOKEN")
# How often each process adds the counters and histograms it observed to the shared totals.
GRAPHENE_METRICS_FLUSH_SECONDS = float(env.integer("GRAPHENE_METRICS_FLUSH_MS", 10_000)) / 1000
# How long per-record metric points and spans are kept (purged hourly by the beat).
GRAPHENE_METRIC_POINTS_RETENTION = timedelta(days=env.integer("GRAPHENE_METRIC_POINTS_RETENTION_DAYS", 7))
GRAPHENE_SPANS_RETENTION = timedelta(days=env.integer("GRAPHENE_SPANS_RETENTION_DAYS", 7))
# Log bounds (checked every 5 minutes): lines older than this go, and a record keeps at most
# this many of its newest lines; what is removed is counted per record and reported.
GRAPHENE_LOG_RETENTION = timedelta(days=env.integer("GRAPHENE_LOG_RETENTION_DAYS", 30))
GRAPHENE_LOG_MAX_LINES_PER_RECORD = env.integer("GRAPHENE_LOG_MAX_LINES_PER_RECORD", 200_000)
CELERY_BEAT_SCHEDULE["logs-trim"] = {
    "task": "apps.observability.tasks.logs_trim_task",
    "schedule": schedule(timedelta(minutes=5)),
}
# Spans are also exported over OTLP/HTTP when an endpoint is set: the standard OpenTelemetry
# variables, interpreted by apps/observability/otlp.py (export is off when both endpoints are unset).
GRAPHENE_OTLP_ENV = {
    name: env.string(name) or ""
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
        "OTEL_SERVICE_NAME",
    )
}
CELERY_BEAT_SCHEDULE["observability-purge"] = {
    "task": "apps.observability.tasks.observability_purge_task",
    "schedule": schedule(timedelta(hours=1)),
}

# --- TLS (graphene_project/cli.py, apps/core/tls.py, apps/core/proxy.py; docs/tls.md) ----------
# The server's certificate (PEM, followed by its intermediates) and its unencrypted key: with
# both set, `graphene web` and `graphene up` serve HTTPS and WSS with them. Without them
# `graphene up` uses its local CA (below) and `graphene web` refuses to start unless a
# TLS-terminating proxy is configured (GRAPHENE_TRUSTED_PROXIES) or --insecure is passed.
GRAPHENE_TLS_CERT_FILE = env.string("GRAPHENE_TLS_CERT_FILE")
GRAPHENE_TLS_KEY_FILE = env.string("GRAPHENE_TLS_KEY_FILE")
# Where `graphene up` keeps its local certificate authority and server certificate.
GRAPHENE_TLS_DIR = DATA_DIR / "tls"
# Names (DNS names or IP addresses) the local CA's server certificate is for, besides localhost,
# 127.0.0.1, ::1, this machine's host name and the host of GRAPHENE_AGENT_SERVER_URL.
GRAPHENE_TLS_HOSTNAMES = env.csv("GRAPHENE_TLS_HOSTNAMES", [])
# The CA certificate (PEM) that issued the server's certificate: agents' install data carries
# it (they refuse a server it did not sign) and /tls/ca.pem serves it to clients that pin it by
# fingerprint. Default: the local CA, when the server uses it (no GRAPHENE_TLS_CERT_FILE). Leave
# it unset for a certificate from a CA the machines already trust.
GRAPHENE_TLS_CA_FILE = env.string("GRAPHENE_TLS_CA_FILE")
# Addresses (IPs or networks, comma-separated) of TLS-terminating proxies: only requests whose
# peer is one of them may say, in X-Forwarded-Proto and X-Forwarded-For, that the client used
# HTTPS and where it came from. Everyone else's X-Forwarded-* headers are dropped on arrival.
GRAPHENE_TRUSTED_PROXIES = trusted_networks(env.csv("GRAPHENE_TRUSTED_PROXIES", []), setting="GRAPHENE_TRUSTED_PROXIES")
# Honoured only as far as the proxy middleware lets the header through: from trusted proxies.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- Agents (apps.agents, agent/graphene_agent) ----------------------------------------------
# The address agents dial, written into install scripts (http(s)://host[:port]; the agent
# turns it into ws(s)://host/agents/connect). Its host must be in ALLOWED_HOSTS. `graphene up`
# sets it to the address it serves on unless it is set.
GRAPHENE_AGENT_SERVER_URL = env.string("GRAPHENE_AGENT_SERVER_URL", "https://127.0.0.1:8000") or ""
# A bootstrap token is single-use and valid this long after agent_declare issued it.
GRAPHENE_AGENT_BOOTSTRAP_TTL_SECONDS = env.integer("GRAPHENE_AGENT_BOOTSTRAP_TTL_SECONDS", 3600)
# Credentials expire after this many days (0: never; revocation still applies).
GRAPHENE_AGENT_CREDENTIAL_TTL_DAYS = env.integer("GRAPHENE_AGENT_CREDENTIAL_TTL_DAYS", 365)
# How often agents send a heartbeat; the gateway also re-reads queued commands on each one.
GRAPHENE_AGENT_HEARTBEAT_SECONDS = env.integer("GRAPHENE_AGENT_HEARTBEAT_SECONDS", 15)
# A disconnected agent's record turns drifted (and its in-flight at-most-once commands
# unknown) after this long without a reconnect.
GRAPHENE_AGENT_DISCONNECT_GRACE_SECONDS = env.integer("GRAPHENE_AGENT_DISCONNECT_GRACE_SECONDS", 60)
# Deleting a record on an agent's machine waits this long for an agent that is away (from
# the deletion request or the disconnect, whichever is later), then gives the object up with
# an event: a machine that is gone for good never keeps a deletion from finishing.
GRAPHENE_AGENT_LOST_DELETE_DEADLINE_SECONDS = env.integer("GRAPHENE_AGENT_LOST_DELETE_DEADLINE_SECONDS", 900)
# Where build_agent writes the zipapp served at /agents/download.
GRAPHENE_AGENT_PYZ = Path(env.string("GRAPHENE_AGENT_PYZ", str(DATA_DIR / "agent" / "graphene-agent.pyz")) or "")
# ctx.agent_via_ssh: timeout of the TCP connect, banner and authentication; attempts at an
# unreachable host (durable timers with backoff in between) before the call fails; and how
# long an installed agent has to dial in before the call fails.
GRAPHENE_AGENT_SSH_TIMEOUT_SECONDS = env.integer("GRAPHENE_AGENT_SSH_TIMEOUT_SECONDS", 20)
GRAPHENE_AGENT_SSH_ATTEMPTS = env.integer("GRAPHENE_AGENT_SSH_ATTEMPTS", 5)
GRAPHENE_AGENT_SSH_CONNECT_TIMEOUT_SECONDS = env.integer("GRAPHENE_AGENT_SSH_CONNECT_TIMEOUT_SECONDS", 300)

# --- Accounts and API tokens (apps.accounts) ------------------------------------------------
# Every API token expires: a token that never expires is the leaked credential that works
# forever. The longest lifetime anyone may give a token, in days.
GRAPHENE_TOKEN_MAX_TTL_DAYS = env.integer("GRAPHENE_TOKEN_MAX_TTL_DAYS", 365)


def _token_ttl_days(name: str, default: int) -> int:
    days = env.integer(name, default)
    if not 1 <= days <= GRAPHENE_TOKEN_MAX_TTL_DAYS:
        raise ImproperlyConfigured(
            f"{name}={days} must be between 1 and GRAPHENE_TOKEN_MAX_TTL_DAYS ({GRAPHENE_TOKEN_MAX_TTL_DAYS})"
        )
    return days


# A user's token (`graphene token`, `graphenectl token create` without --expires-in, the first
# admin's) lives this long: 90 days, so that a token left in a laptop's graphenectl config or a
# CI variable dies within a quarter, while its owner renews it four times a year, not weekly.
GRAPHENE_USER_TOKEN_TTL_DAYS = _token_ttl_days("GRAPHENE_USER_TOKEN_TTL_DAYS", 90)
# A service account's token without an explicit --expires-in: the same quarter.
GRAPHENE_SERVICE_ACCOUNT_TOKEN_TTL_DAYS = _token_ttl_days("GRAPHENE_SERVICE_ACCOUNT_TOKEN_TTL_DAYS", 90)

# --- Secrets (apps.secrets) -------------------------------------------------------------------
# Keys of the secret store's encryption at rest, comma-separated, newest first (the first
# encrypts, all decrypt: rotate by prepending). Required in production. Without it, the key is
# derived from SECRET_KEY, and changing SECRET_KEY makes the stored secrets unreadable.
GRAPHENE_SECRETS_KEY = env.csv("GRAPHENE_SECRETS_KEY", [])

# --- Artifacts (apps.artifacts) ---------------------------------------------------------------
# The blob store: content-addressed files (sha256) beside the database, shared by every process
# that serves or executes runs (in production: a shared volume mounted on web and workers).
GRAPHENE_ARTIFACT_ROOT = Path(env.string("GRAPHENE_ARTIFACT_ROOT", str(DATA_DIR / "artifacts")) or "")
# The largest artifact accepted (an upload, ctx.publish_artifact), in bytes; default 1 GiB.
GRAPHENE_ARTIFACT_MAX_BYTES = env.integer("GRAPHENE_ARTIFACT_MAX_BYTES", 1024**3)
# The orphan sweeper leaves blobs and partial uploads younger than this alone: a publish writes
# its blob before its record commits.
GRAPHENE_ARTIFACT_SWEEP_GRACE_SECONDS = env.integer("GRAPHENE_ARTIFACT_SWEEP_GRACE_SECONDS", 3600)

# --- Docker kinds (kinds/docker) -------------------------------------------------------------
# The dockerd the docker.* kinds talk to: GRAPHENE_DOCKER_HOST, else the standard DOCKER_HOST
# (read here too, as the docker CLI would), else the local socket.
GRAPHENE_DOCKER_HOST = env.string("GRAPHENE_DOCKER_HOST") or env.string("DOCKER_HOST") or "unix:///var/run/docker.sock"
# The label value (graphene.scope) marking this installation's objects; the orphan sweeper
# only touches objects of its own scope. Empty: derived from the database's identity.
GRAPHENE_DOCKER_SCOPE = env.string("GRAPHENE_DOCKER_SCOPE", "") or ""
