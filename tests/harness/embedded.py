"""``graphene up`` (the embedded mode) as a real process, and graphenectl as a user runs it.

The server runs with its own SQLite data directory and the example pipelines: nothing of the
test settings (PostgreSQL, Redis) reaches it. It serves HTTPS with the local CA it makes on its
first start (``ca_file``), which graphenectl pins at login. graphenectl runs as a subprocess,
with its config under a temporary ``XDG_CONFIG_HOME``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness import tls
from tests.harness.net import free_port, http
from tests.harness.processes import REPO, WITH_DEFAULT_SIGINT, Service

START_DEADLINE = 90.0


class Server(Service):
    """``graphene up`` on a free port with a fresh data directory; ``token`` is its admin's,
    ``ca_file`` its local CA."""

    def __init__(self, root: Path) -> None:
        super().__init__(root / "server.log")
        self.data = root / "data"
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.ca_file = self.data / "tls" / "ca.pem"
        self.what = f"graphene up on port {self.port}"
        self.token = ""

    def start(self) -> Server:
        # Nothing from the test settings (PostgreSQL, Redis) may leak in: embedded mode on SQLite.
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHENE_")}
        env.update(
            DJANGO_SETTINGS_MODULE="graphene_project.settings.dev",
            GRAPHENE_DATA_DIR=str(self.data),
            GRAPHENE_PIPELINE_DIRS=str(REPO / "examples" / "pipelines"),
        )
        script = Path(sys.executable).parent / "graphene"
        command = [str(script)] if script.exists() else [sys.executable, "-m", "graphene_project.cli"]
        self.spawn([*command, "up", "--host", "127.0.0.1", "--port", str(self.port)], env=env, timeout=START_DEADLINE)
        self.token = json.loads((self.data / "admin-credentials.json").read_text())["token"]
        return self

    def ready(self) -> bool:
        if not self.ca_file.exists():
            return False
        try:
            status, body = http("GET", f"{self.url}/readyz", timeout=5, context=self.context)
        except (OSError, ValueError):
            return False
        return status == 200 and body["status"] == "ok"

    def output(self) -> str:
        """What ``graphene up`` printed (stdout and stderr)."""
        return self.log.read_text(errors="replace")

    @property
    def context(self) -> Any:
        """An SSL context that trusts this server's CA only."""
        return tls.context_for(self.ca_file)

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """The REST API directly, to compare graphenectl's output with it."""
        return http(
            method,
            f"{self.url}/api/v1/{path.lstrip('/')}",
            token=self.token,
            body=body,
            timeout=60,
            context=self.context,
        )

    def get(self, path: str) -> Any:
        status, body = self.api("GET", path)
        assert status == 200, (path, status, body)
        return body


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def graphenectl_argv() -> list[str]:
    script = Path(sys.executable).parent / "graphenectl"
    return [str(script)] if script.exists() else [sys.executable, "-m", "graphenectl"]


class Ctl:
    """Runs graphenectl as a subprocess with its own config directory."""

    def __init__(self, config_home: Path, **env: str) -> None:
        self.config_home = config_home
        self.extra_env = env

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHENE_")}
        env.update({"XDG_CONFIG_HOME": str(self.config_home), "NO_COLOR": "1", "COLUMNS": "200"})
        env.update({**self.extra_env, **extra})  # either may set COLUMNS too
        return env

    def __call__(
        self, *args: str, stdin: str | None = None, timeout: float = 60, env: dict[str, str] | None = None
    ) -> Result:
        proc = subprocess.run(
            [*graphenectl_argv(), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env(**(env or {})),
            timeout=timeout,
            check=False,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def ok(self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> Result:
        result = self(*args, stdin=stdin, env=env)
        assert result.code == 0, f"graphenectl {' '.join(args)} exited {result.code}:\n{result.err}\n{result.out}"
        return result

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*WITH_DEFAULT_SIGINT, *graphenectl_argv(), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=self.env(),
        )
