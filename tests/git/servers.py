"""Real git servers on loopback for the git tests, and upstream repositories to serve.

* ``GitDaemon``: ``git daemon`` (the git:// protocol, fetch and push) as a child process.
* ``GitHTTP``: git's own ``git http-backend`` behind a small threaded HTTP server that demands
  Basic authentication — the smart HTTP protocol a GitHub or GitLab speaks, without TLS. While
  a request is in flight (the git client waits for the answer) it looks at the command line of
  every process on the machine for the password: ``ps`` must never show it.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.harness.net import free_port
from tests.harness.processes import Service

IDENTITY = {
    "GIT_AUTHOR_NAME": "Upstream",
    "GIT_AUTHOR_EMAIL": "upstream@example.invalid",
    "GIT_COMMITTER_NAME": "Upstream",
    "GIT_COMMITTER_EMAIL": "upstream@example.invalid",
}


def git(*args: str, cwd: Path | None = None) -> str:
    """Run git as a test's own tool (not through the code under test); its stdout, stripped."""
    env = {**os.environ, **IDENTITY, "GIT_TERMINAL_PROMPT": "0"}
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {done.stderr}")
    return done.stdout.strip()


@dataclass
class Upstream:
    """A bare repository under a server's base path, and a work clone to make commits with."""

    bare: Path
    work: Path
    shas: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.bare.name

    def file_url(self) -> str:
        return self.bare.as_uri()

    def commit(self, message: str, files: dict[str, str], branch: str = "main") -> str:
        if git("symbolic-ref", "--short", "HEAD", cwd=self.work) != branch:
            git("checkout", "--quiet", branch, cwd=self.work)
        for name, content in files.items():
            path = self.work / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        git("add", "--all", cwd=self.work)
        git("commit", "--quiet", "-m", message, cwd=self.work)
        git("push", "--quiet", "origin", branch, cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work)

    def ref(self, ref: str) -> str:
        """What ``ref`` names in the bare repository now (tags peeled to their commit)."""
        return git("rev-parse", f"{ref}^{{commit}}", cwd=self.bare)


def make_upstream(base: Path, name: str) -> Upstream:
    """``<base>/<name>.git``: main (two commits), tags v1 (lightweight, first commit) and v2.0
    (annotated, second), and a branch ``feature`` one commit ahead of main."""
    bare = base / f"{name}.git"
    work = base / f"{name}-work"
    git("init", "--quiet", "--bare", "--initial-branch=main", str(bare))
    git("clone", "--quiet", str(bare), str(work))
    git("symbolic-ref", "HEAD", "refs/heads/main", cwd=work)
    upstream = Upstream(bare=bare, work=work)
    first = upstream.commit("first", {"README": "version 1\n", "src/app.py": "print('v1')\n"})
    git("tag", "v1", first, cwd=work)
    second = upstream.commit("second", {"README": "version 2\n"})
    git("tag", "-a", "v2.0", "-m", "release 2.0", second, cwd=work)
    git("push", "--quiet", "origin", "--tags", cwd=work)
    git("checkout", "--quiet", "-b", "feature", cwd=work)
    feature = upstream.commit("feature work", {"FEATURE": "on\n"}, branch="feature")
    git("checkout", "--quiet", "main", cwd=work)
    upstream.shas.update(first=first, second=second, feature=feature)
    return upstream


class GitDaemon(Service):
    """``git daemon`` serving every repository under ``base`` on 127.0.0.1, push enabled."""

    def __init__(self, base: Path, log: Path) -> None:
        super().__init__(log)
        self.base = base
        self.port = free_port()
        self.what = f"git daemon on port {self.port}"

    def url(self, upstream: Upstream) -> str:
        return f"git://127.0.0.1:{self.port}/{upstream.bare.name}"

    def start(self) -> GitDaemon:
        self.spawn(
            [
                "git", "daemon", "--export-all", "--reuseaddr", "--informative-errors",
                f"--base-path={self.base}", f"--port={self.port}", "--listen=127.0.0.1",
                "--enable=receive-pack", str(self.base),
            ],
            timeout=30,
        )  # fmt: skip
        return self

    def ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2):
                return True
        except OSError:
            return False

    def stop(self, timeout: float = 30) -> None:
        super().stop(timeout)  # the daemon and its per-connection children


def command_lines_containing(needle: str) -> list[str]:
    """The command lines (``ps``'s view) of every process on the machine that contain ``needle``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
        if needle.encode() in argv:
            found.append(argv.replace(b"\0", b" ").decode(errors="replace"))
    return found


class GitHTTP:
    """Smart HTTP (``git http-backend``) for the repositories under ``base``, Basic auth required."""

    def __init__(self, base: Path, username: str, password: str) -> None:
        self.base = base
        self.username = username
        self.password = password
        self.expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        self.requests: list[tuple[str, str, bool]] = []  # (method, path, authorized)
        self.leaks: list[str] = []  # command lines that showed the password, seen mid-request
        self.clients_seen: list[str] = []  # command lines of the git clients talking to us, mid-request
        self.on_request: Callable[[], None] | None = None
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, name="git-http", daemon=True)

    def url(self, upstream: Upstream) -> str:
        return f"http://127.0.0.1:{self.port}/{upstream.bare.name}"

    def start(self) -> GitHTTP:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _inspect(self) -> None:
        # The client is blocked on this answer: its git processes are alive right now.
        self.clients_seen += [c for c in command_lines_containing(f"127.0.0.1:{self.port}/") if "git" in c.split()[0]]
        self.leaks += command_lines_containing(self.password)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks: list[bytes] = []
                    while True:
                        size = int(self.rfile.readline().strip().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _serve(self) -> None:
                body = self._body()
                path, _, query = self.path.partition("?")
                authorized = self.headers.get("Authorization") == outer.expected
                outer.requests.append((self.command, path, authorized))
                outer._inspect()
                if not authorized:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                env = {
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "GIT_PROJECT_ROOT": str(outer.base),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "PATH_INFO": path,
                    "QUERY_STRING": query,
                    "REQUEST_METHOD": self.command,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "REMOTE_USER": outer.username,  # enables receive-pack (push)
                    "REMOTE_ADDR": "127.0.0.1",
                    "HTTP_GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                    "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                }
                done = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=False)
                head, _, payload = done.stdout.partition(b"\r\n\r\n")
                if not _:
                    head, _, payload = done.stdout.partition(b"\n\n")
                status = 200
                headers = []
                for line in head.decode(errors="replace").splitlines():
                    key, _, value = line.partition(":")
                    if key.lower() == "status":
                        status = int(value.strip().split()[0])
                    elif key:
                        headers.append((key, value.strip()))
                self.send_response(status)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

        return Handler
