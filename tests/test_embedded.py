"""Smoke test of the embedded mode: ``graphene up`` for real, as a newcomer starts it.

One process with SQLite under a fresh data directory, the in-process broker, and worker and
beat threads; no GRAPHENE_DATABASE_URL / BROKER / CHANNEL settings at all. The test drives it
over HTTPS only, trusting the local CA the first start made: a record that becomes ``ready``
proves the in-process worker thread ran.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import ssl
import stat
import subprocess
import sys
import urllib.error
from collections.abc import Callable, Iterator
from http.client import RemoteDisconnected
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from websockets.typing import Origin

from apps.core.tls import certificate_names, fingerprint
from tests.harness import net, tls
from tests.harness.net import free_port
from tests.harness.processes import REPO, WITH_DEFAULT_SIGINT
from tests.harness.wait import wait_for
from tests.harness.ws import open_ws

pytestmark = pytest.mark.system

START_DEADLINE = 90.0
STOP_DEADLINE = 20.0


def http(method: str, url: str, **options: Any) -> tuple[int, Any]:
    """A request to the embedded server, which may take a while to answer (``?wait=true``),
    trusting the local CA of the server the URL names."""
    port = int(url.split(":")[2].split("/")[0])
    return net.http(method, url, timeout=90, context=tls.context_for(CA_FILES[port]), **options)


CA_FILES: dict[int, Path] = {}  # the local CA of each server started here, by port


class Server:
    """``graphene up`` in a subprocess, with its output in a log file."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        self.data_dir = data_dir
        self.log = log
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.ca_file = data_dir / "tls" / "ca.pem"
        CA_FILES[self.port] = self.ca_file
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        # Nothing from the test settings (which point at PostgreSQL and Redis) may leak in.
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHENE_")}
        env.update(DJANGO_SETTINGS_MODULE="graphene_project.settings.dev", GRAPHENE_DATA_DIR=str(self.data_dir))
        return env

    def start(self) -> Server:
        script = Path(sys.executable).parent / "graphene"
        command = [str(script)] if script.exists() else [sys.executable, "-m", "graphene_project.cli"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*WITH_DEFAULT_SIGINT, *command, "up", "--host", "127.0.0.1", "--port", str(self.port)],
                cwd=REPO,
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_for(self._ready, timeout=START_DEADLINE, what=f"/readyz of graphene up (log {self.log})")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"graphene up exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
        if not self.ca_file.exists():
            return False
        try:
            status, body = http("GET", f"{self.url}/readyz")
        except OSError:
            return False
        return status == 200 and body["status"] == "ok"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def interrupt(self) -> int:
        """Ctrl-C, as a user stops it; it must exit by itself within the deadline."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(f"graphene up did not exit within {STOP_DEADLINE}s of SIGINT") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Callable[[], Server]]:
    started: list[Server] = []

    def start() -> Server:
        server = Server(tmp_path / "data", tmp_path / "server.log").start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


def test_graphene_up_serves_the_embedded_mode_end_to_end(servers: Callable[[], Server], tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = servers()
    ready = http("GET", f"{server.url}/readyz")[1]["checks"]
    assert ready["database"]["detail"] == "sqlite"
    assert ready["broker"]["detail"] == "in-process (embedded)"
    assert (data / "graphene.sqlite3").is_file()

    # First start: a local CA and a server certificate, the keys for the user only; the CA's
    # fingerprint and file are printed (what clients pin).
    tls_dir = data / "tls"
    assert stat.S_IMODE(tls_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((tls_dir / "ca-key.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((tls_dir / "server-key.pem").stat().st_mode) == 0o600
    ca_pem, server_pem = (tls_dir / "ca.pem").read_bytes(), (tls_dir / "server.pem").read_bytes()
    printed = re.search(r"CA fingerprint \(SHA-256\) ([0-9A-F:]{95})", server.output())
    assert printed, server.output()
    assert printed.group(1) == fingerprint(ca_pem.decode())
    assert f"local CA {tls_dir / 'ca.pem'} (made now" in server.output()
    served = x509.load_pem_x509_certificate(ssl.get_server_certificate(("127.0.0.1", server.port)).encode())
    assert served == x509.load_pem_x509_certificate(server_pem)
    assert {"localhost", "127.0.0.1", "::1"} <= certificate_names(served)
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # nobody else vouches for it
        net.http("GET", f"{server.url}/healthz", context=ssl.create_default_context())
    with pytest.raises(RemoteDisconnected):  # no plain HTTP beside it
        net.http("GET", f"http://127.0.0.1:{server.port}/healthz", timeout=10)

    # First start: an admin and a token, saved for the user only.
    creds_file = data / "admin-credentials.json"
    assert stat.S_IMODE(creds_file.stat().st_mode) == 0o600
    creds = json.loads(creds_file.read_text())
    assert creds["username"] == "admin"
    assert creds["password"]
    assert creds["token"]
    first_output = server.output()
    assert "first start: created user 'admin'" in first_output
    assert creds["token"] in first_output

    token = creds["token"]
    api = f"{server.url}/api/v1"
    # Websockets are served over TLS too (wss), verified against the same CA.
    with open_ws(
        f"wss://127.0.0.1:{server.port}/ws/runs/",
        log=server.log,
        ssl=tls.context_for(server.ca_file),
        origin=Origin(server.url),
        additional_headers={"Authorization": f"Token {token}"},
    ) as runs_socket:
        assert runs_socket.response is not None
        assert runs_socket.response.status_code == 101
    assert http("GET", f"{api}/records/")[0] in {401, 403}, "the API must require authentication"
    # The first admin and its token are in the audit trail, as the command's doing.
    status, trail = http("GET", f"{api}/audit/?namespace=*", token=token)
    assert status == 200, trail
    first_rows = [(r["action"], r["object_name"], r["actor_kind"], r["actor_name"]) for r in trail["results"]]
    assert first_rows[-2:] == [
        ("token.create", f"{token[:12]}… of admin", "system", "graphene up"),
        ("user.create", "admin", "system", "graphene up"),
    ]
    assert token[12:] not in json.dumps(trail)
    assert creds["password"] not in json.dumps(trail)
    status, kinds = http("GET", f"{api}/kinds/", token=token)
    assert status == 200
    assert {"file", "test.sleep", "test.flaky"} <= {k["name"] for k in kinds}

    status, stand = http("POST", f"{api}/records/", token=token, body={"kind": "graphene.stand", "name": "smoke"})
    assert status == 201, stand
    status, child = http(
        "POST",
        f"{api}/records/",
        token=token,
        body={"kind": "test.sleep", "name": "box", "owner": stand["id"], "spec": {"create_ms": 300}},
    )
    assert status == 201, child
    # Committed before the kind runs (I1); the worker thread inside the server makes it ready.
    assert child["phase"] == "pending"

    def child_ready() -> bool:
        record = http("GET", f"{api}/records/{child['id']}/", token=token)[1]
        assert record["phase"] in {"pending", "creating", "ready"}, record
        return bool(record["phase"] == "ready")

    wait_for(child_ready, timeout=30, what="the test.sleep record to be ready (the in-process worker)")
    status, tree = http("GET", f"{api}/records/{stand['id']}/tree/?depth=3", token=token)
    assert status == 200
    assert [(c["kind"], c["name"], c["phase"]) for c in tree["children"]] == [("test.sleep", "box", "ready")]

    status, deleted = http("DELETE", f"{api}/records/{stand['id']}/?wait=true&timeout=60", token=token)
    assert status == 200, deleted
    assert deleted["phase"] == "deleted"
    assert http("GET", f"{api}/records/{child['id']}/", token=token)[1]["phase"] == "deleted"

    assert server.interrupt() == 0
    assert "Traceback" not in server.output()

    # Second start on the same data: no second admin; it says how to log in instead.
    second = servers()
    output = second.output()[len(first_output) :]
    assert "log in as 'admin'" in output
    assert "created user" not in output
    # The same CA and server certificate: clients that pinned it connect as before.
    assert (tls_dir / "ca.pem").read_bytes() == ca_pem
    assert (tls_dir / "server.pem").read_bytes() == server_pem
    assert f"CA fingerprint (SHA-256) {printed.group(1)}" in output
    assert "made now" not in output
    assert "issued now" not in output
    assert json.loads(creds_file.read_text()) == creds
    assert http("GET", f"{second.url}/api/v1/records/{stand['id']}/", token=token)[1]["phase"] == "deleted"
    with sqlite3.connect(data / "graphene.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM auth_user").fetchone()[0] == 1
    assert second.interrupt() == 0
    assert "Traceback" not in second.output()
