"""Django settings for the run benchmarks (``bench/step_overhead.py``, ``bench/run_latency.py``,
``bench/suspended_runs.py``), in the benchmark process and in its workers.

The test settings plus what a benchmark needs:

* ``CELERY_IMPORTS``: workers import ``bench._runs_pipelines`` at start-up, which registers
  the bare Celery task the latency benchmark compares against (pipelines are imported lazily
  by the engine; a Celery task must be known before its first message arrives).
* the production channel layer: with ``GRAPHENE_CHANNEL_LAYER_URL`` set, Redis (as
  ``settings/base.py`` and ``prod.py`` have it) instead of the test settings' in-memory layer,
  so every run-status and record notification costs what it costs in production.
* ``GRAPHENE_BENCH_CONVERGE_SEPARATELY=1``: record convergence (``record_converge_task``) goes
  to the queue ``<GRAPHENE_QUEUE>-converge`` instead of the default one. The suspended-runs
  benchmark uses it to keep its records ``pending`` for 60 s: nobody consumes that queue until
  it starts a convergence worker at the 60 s mark. Runs and deletions stay on the default queue.
"""

import os

from graphene_project.settings.test import *  # noqa: F403

CELERY_IMPORTS = ["bench._runs_pipelines"]

if os.environ.get("GRAPHENE_CHANNEL_LAYER_URL"):
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # socket_timeout as in settings/base.py: an idle consumer (an agent's connection
            # between commands) waits 5 s in BZPOPMIN, redis-py >= 8 times reads out at 5 s.
            "CONFIG": {"hosts": [{"address": os.environ["GRAPHENE_CHANNEL_LAYER_URL"], "socket_timeout": 30}]},
        }
    }

if os.environ.get("GRAPHENE_BENCH_CONVERGE_SEPARATELY"):
    CONVERGE_QUEUE = f"{CELERY_TASK_DEFAULT_QUEUE}-converge"  # noqa: F405
    CELERY_TASK_ROUTES = {"apps.records.tasks.record_converge_task": {"queue": CONVERGE_QUEUE}}
