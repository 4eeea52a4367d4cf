"""Real processes for the observability system tests: Celery workers that flush their metrics
quickly, and a web server (daphne) on this test's database for graphenectl to talk to."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import graphenectl_argv
from tests.conftest import REPO, Worker, process_env, wait_for

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only
# Workers add their counters and histograms to the shared totals this often (default 10 s).
FLUSH_MS = "200"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http(url: str, *, token: str | None = None, scheme: str = "Token") -> tuple[int, bytes]:
    headers = {"Authorization": f"{scheme} {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - http://127.0.0.1 only
    try:
        with _opener.open(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@dataclass
class WebServer:
    """daphne serving the project (test settings) against this test's database."""

    log: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> WebServer:
        self.port = free_port()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
                 "graphene_project.asgi:application"],
                cwd=REPO,
                env=process_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        wait_for(self._ready, timeout=60, what=f"daphne on port {self.port} (log {self.log})")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"daphne exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            return http(f"{self.url}/healthz")[0] == 200
        except OSError:
            return False

    def get(self, path: str, token: str, **params: str) -> tuple[int, Any]:
        query = urllib.parse.urlencode(params)
        status, raw = http(f"{self.url}/api/v1/{path}" + (f"?{query}" if query else ""), token=token)
        return status, json.loads(raw)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)


@pytest.fixture
def fast_flush_worker(start_worker: Callable[..., Worker], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Worker]:
    """``start_worker`` whose workers flush their metrics every 200 ms."""
    monkeypatch.setenv("GRAPHENE_METRICS_FLUSH_MS", FLUSH_MS)
    return start_worker


@pytest.fixture
def web(transactional_db: None, tmp_path: Path) -> Iterator[WebServer]:
    server = WebServer(tmp_path / "web.log").start()
    yield server
    server.stop()


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def graphenectl(server: WebServer, token: str, *args: str) -> Result:
    """graphenectl as a user runs it, pointed at ``server`` through the environment."""
    argv = graphenectl_argv()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHENE_")}
    env.update(GRAPHENE_SERVER=server.url, GRAPHENE_TOKEN=token, NO_COLOR="1", COLUMNS="250")
    proc = subprocess.run(
        [*argv, *args], capture_output=True, text=True, env=env, timeout=60, check=False, stdin=subprocess.DEVNULL
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)
