"""The web server as a real process: daphne serving the project on loopback, over TLS with the
session's certificate (``tests.harness.tls``), as Graphene serves by default."""

from __future__ import annotations

import json
import sys
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from tests.harness import tls
from tests.harness.net import fetch, free_port
from tests.harness.processes import CHANNEL_LAYER_URL, REPO, Service, process_env
from tests.harness.wait import wait_for


class WebServer(Service):
    """daphne serving the project against the session's test database, with the Redis channel layer,
    over HTTPS and WSS with the session's certificate: clients trust ``ca_file`` (its CA).

    The port is chosen once: a restart (``kill`` then ``start``) serves on the same address, so
    agents that dial it reconnect, as they would to a real server coming back.
    """

    def __init__(self, log_dir: Path, **env: str) -> None:
        self.port = free_port()
        super().__init__(log_dir / f"web-{self.port}.log")
        self.url = f"https://127.0.0.1:{self.port}"
        self.what = f"daphne on port {self.port}"
        self.ca_file = tls.ca_file()
        self.env = env  # settings of this server's own (GRAPHENE_* variables)

    @property
    def ws_url(self) -> str:
        return self.url.replace("https://", "wss://", 1)

    def client_env(self) -> dict[str, str]:
        """What graphenectl and the SDK need from the environment to reach this server (with a token)."""
        return {"GRAPHENE_SERVER": self.url, "GRAPHENE_CA_FILE": str(self.ca_file)}

    def start(self) -> WebServer:
        self.spawn(
            [sys.executable, "-m", "daphne", "-e", tls.endpoint(self.port), "graphene_project.asgi:application"],
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
            status, _ = fetch(f"{self.url}/healthz", context=tls.context_for(self.ca_file))
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
    session's test database, broker and channel layer, serving HTTPS on loopback with the
    session's certificate as ``GRAPHENE_TLS_CERT_FILE``/``GRAPHENE_TLS_KEY_FILE``. For promises
    about one web process as installed (its database connections, its TLS): ``env`` adds
    settings, ``args`` options (``--insecure`` serves plain HTTP: then ``url`` is http://).

    Its connections carry an ``application_name`` of their own (``pg_stat_activity`` tells them
    from those of other processes and sessions)."""

    def __init__(self, log_dir: Path, *args: str, **env: str) -> None:
        super().__init__(log_dir, **env)
        self.what = f"graphene web on port {self.port}"
        self.application_name = f"graphene-web-test-{uuid.uuid4().hex[:8]}"
        self.args = args
        session = tls.session_tls()
        self.tls_env = {
            "GRAPHENE_TLS_CERT_FILE": str(session.cert_path),
            "GRAPHENE_TLS_KEY_FILE": str(session.key_path),
        }
        if "--insecure" in args or "GRAPHENE_TRUSTED_PROXIES" in env:
            self.url = f"http://127.0.0.1:{self.port}"
            self.tls_env = {}

    def argv(self) -> list[str]:
        script = Path(sys.executable).parent / "graphene"
        command = [str(script)] if script.exists() else [sys.executable, "-m", "graphene_project.cli"]
        return [*command, "web", "--host", "127.0.0.1", "--port", str(self.port), *self.args]

    def environment(self) -> dict[str, str]:
        database_url = process_env()["GRAPHENE_DATABASE_URL"] + f"?application_name={self.application_name}"
        settings = {
            "DJANGO_SETTINGS_MODULE": "graphene_project.settings.prod",
            "GRAPHENE_DATABASE_URL": database_url,
            "GRAPHENE_SECRET_KEY": "test-only-8fQ2mZ7vK1xR4tW9yB6nC3jH5sL0dP2gA7uE4iO9-not-secret",
            "GRAPHENE_SECRETS_KEY": "test-only-secrets-key-not-secret",
            "GRAPHENE_CHANNEL_LAYER_URL": CHANNEL_LAYER_URL,
            "GRAPHENE_AGENT_SERVER_URL": self.url,
            # No redirect to HTTPS unless a test asks for one: most serve plain HTTP only with --insecure.
            "GRAPHENE_SECURE_SSL_REDIRECT": "0",
            **self.tls_env,
        }
        return process_env(**{**settings, **self.env})

    def start(self) -> ProductionWeb:
        self.spawn(self.argv(), cwd=REPO, env=self.environment())
        return self
