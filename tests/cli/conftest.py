"""One real ``graphene up`` (embedded mode) for the whole CLI session, and a way to run graphenectl.

The server runs in a subprocess with its own SQLite data directory and the example pipelines;
graphenectl runs as a subprocess too, as a user runs it, with its config under a temporary
``XDG_CONFIG_HOME``. Nothing here touches the test database: these are plain functions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.net import free_port, http
from tests.harness.processes import REPO, WITH_DEFAULT_SIGINT
from tests.harness.wait import wait_for

START_DEADLINE = 90.0


@dataclass
class Server:
    url: str
    token: str
    log: Path

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """The REST API directly, to compare graphenectl's output with it."""
        return http(method, f"{self.url}/api/v1/{path.lstrip('/')}", token=self.token, body=body, timeout=60)

    def get(self, path: str) -> Any:
        status, body = self.api("GET", path)
        assert status == 200, (path, status, body)
        return body


def _ready(url: str) -> bool:
    try:
        status, body = http("GET", f"{url}/readyz", timeout=5)
    except (OSError, ValueError):
        return False
    return status == 200 and body["status"] == "ok"


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``graphene up`` on a free port with a fresh data directory, shared by the CLI tests."""
    root = tmp_path_factory.mktemp("graphene-cli")
    data, log = root / "data", root / "server.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Nothing from the test settings (PostgreSQL, Redis) may leak in: embedded mode on SQLite.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHENE_")}
    env.update(
        DJANGO_SETTINGS_MODULE="graphene_project.settings.dev",
        GRAPHENE_DATA_DIR=str(data),
        GRAPHENE_PIPELINE_DIRS=str(REPO / "examples" / "pipelines"),
    )
    script = Path(sys.executable).parent / "graphene"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "graphene_project.cli"]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*command, "up", "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"graphene up exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            return _ready(url)

        wait_for(up, timeout=START_DEADLINE, interval=0.1, what=f"graphene up to be ready (log {log})")
        token = json.loads((data / "admin-credentials.json").read_text())["token"]
        yield Server(url=url, token=token, log=log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


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
        env.update(XDG_CONFIG_HOME=str(self.config_home), NO_COLOR="1", COLUMNS="200", **self.extra_env, **extra)
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


@pytest.fixture(scope="session")
def ctl(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Ctl:
    """graphenectl logged in to the session's server (a context saved by ``login``)."""
    ctl = Ctl(tmp_path_factory.mktemp("graphenectl-config"))
    ctl.ok("login", "--server", server.url, "--token-stdin", "--name", "test", stdin=server.token + "\n")
    return ctl
