"""The web server as a real process: daphne serving the project on loopback."""

from __future__ import annotations

import json
import sys
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from tests.harness.net import fetch, free_port
from tests.harness.processes import CHANNEL_LAYER_URL, REPO, Service, process_env
from tests.harness.wait import wait_for


class WebServer(Service):
    """daphne serving the project against the session's test database, with the Redis channel layer.

    The port is chosen once: a restart (``kill`` then ``start``) serves on the same address, so
    agents that dial it reconnect, as they would to a real server coming back.
    """

    def __init__(self, log_dir: Path, **env: str) -> None:
        self.port = free_port()
        super().__init__(log_dir / f"web-{self.port}.log")
        self.url = f"http://127.0.0.1:{self.port}"
        self.what = f"daphne on port {self.port}"
        self.env = env  # settings of this server's own (GRAPHENE_* variables)

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
                **self.env,
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


class ProductionWeb(WebServer):
    """``graphene web`` under the production settings (``graphene_project.settings.prod``) on the
    session's test database, broker and channel layer, plain HTTP on loopback. For promises about
    one web process as installed (its database connections): ``env`` adds settings.

    Its connections carry an ``application_name`` of their own (``pg_stat_activity`` tells them
    from those of other processes and sessions)."""

    def __init__(self, log_dir: Path, **env: str) -> None:
        super().__init__(log_dir, **env)
        self.what = f"graphene web on port {self.port}"
        self.application_name = f"graphene-web-test-{uuid.uuid4().hex[:8]}"

    def start(self) -> ProductionWeb:
        database_url = process_env()["GRAPHENE_DATABASE_URL"] + f"?application_name={self.application_name}"
        script = Path(sys.executable).parent / "graphene"
        command = [str(script)] if script.exists() else [sys.executable, "-m", "graphene_project.cli"]
        self.spawn(
            [*command, "web", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=REPO,
            env=process_env(
                DJANGO_SETTINGS_MODULE="graphene_project.settings.prod",
                GRAPHENE_DATABASE_URL=database_url,
                GRAPHENE_SECRET_KEY="test-only-8fQ2mZ7vK1xR4tW9yB6nC3jH5sL0dP2gA7uE4iO9-not-secret",
                GRAPHENE_SECRETS_KEY="test-only-secrets-key-not-secret",
                GRAPHENE_CHANNEL_LAYER_URL=CHANNEL_LAYER_URL,
                GRAPHENE_AGENT_SERVER_URL=self.url,
                # No TLS in front of it here: plain HTTP must not be redirected.
                GRAPHENE_SECURE_SSL_REDIRECT="0",
                **self.env,
            ),
        )
        return self
