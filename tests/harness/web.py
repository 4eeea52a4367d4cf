"""The web server as a real process: daphne serving the project on loopback."""

from __future__ import annotations

import json
import sys
import urllib.parse
from pathlib import Path
from typing import Any

from tests.harness.net import fetch, free_port
from tests.harness.processes import CHANNEL_LAYER_URL, Service, process_env
from tests.harness.wait import wait_for


class WebServer(Service):
    """daphne serving the project against the session's test database, with the Redis channel layer.

    The port is chosen once: a restart (``kill`` then ``start``) serves on the same address, so
    agents that dial it reconnect, as they would to a real server coming back.
    """

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        super().__init__(log_dir / f"web-{self.port}.log")
        self.url = f"http://127.0.0.1:{self.port}"
        self.what = f"daphne on port {self.port}"

    def start(self) -> WebServer:
        self.spawn(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "graphene_project.asgi:application",
            ],
            env=process_env(
                DJANGO_SETTINGS_MODULE="tests.harness.web_settings",
                GRAPHENE_TEST_AGENTS_CHANNEL_LAYER_URL=CHANNEL_LAYER_URL,
                GRAPHENE_AGENT_SERVER_URL=self.url,
            ),
        )
        return self

    def ready(self) -> bool:
        try:
            status, _ = fetch(f"{self.url}/healthz")
        except OSError:
            return False
        return status == 200

    def get(self, path: str, token: str, **params: str) -> tuple[int, Any]:
        """``GET /api/v1/<path>`` with a token; the status and the decoded body."""
        query = urllib.parse.urlencode(params)
        status, raw = fetch(f"{self.url}/api/v1/{path}" + (f"?{query}" if query else ""), token=token)
        return status, json.loads(raw)

    def stop(self, timeout: float = 15) -> None:
        super().stop(timeout)

    def quiesce(self, timeout: float = 30) -> None:
        """Wait until the server has handled the disconnect of every agent (its last writes)."""
        from apps.agents.models import Agent

        wait_for(
            lambda: not Agent.objects.filter(session__isnull=False).exists(),
            timeout=timeout,
            what=f"the web server to see every agent go (log {self.log})",
        )
