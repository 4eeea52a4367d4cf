"""Fixtures of the observability system tests: Celery workers of their own that flush their
metrics quickly, and graphenectl pointed at the web server (``web``, from tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import pytest

from tests.harness.embedded import Result, graphenectl_argv
from tests.harness.processes import Worker
from tests.harness.web import WebServer

# Workers add their counters and histograms to the shared totals this often (default 10 s).
FLUSH_MS = "200"


@pytest.fixture
def fast_flush_worker(start_worker: Callable[..., Worker], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Worker]:
    """``start_worker`` whose workers flush their metrics every 200 ms."""
    monkeypatch.setenv("GRAPHENE_METRICS_FLUSH_MS", FLUSH_MS)
    return start_worker


def graphenectl(server: WebServer, token: str, *args: str) -> Result:
    """graphenectl as a user runs it, pointed at ``server`` through the environment."""
    argv = graphenectl_argv()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHENE_")}
    env.update(server.client_env(), GRAPHENE_TOKEN=token, NO_COLOR="1", COLUMNS="250")
    proc = subprocess.run(
        [*argv, *args], capture_output=True, text=True, env=env, timeout=60, check=False, stdin=subprocess.DEVNULL
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)
