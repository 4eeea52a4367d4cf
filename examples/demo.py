#!/usr/bin/env python3
"""``make demo``: start Graphene in embedded mode, run an example pipeline end to end, stop Graphene.

1. chooses the example: when a Docker engine answers ``docker info`` within a few seconds
   and a static busybox and git are installed, ``examples/ephemeral_env.py`` (real
   containers: an image imported from a busybox tar, a network, a database and an app, a git
   checkout, the checkout's tests run in a job container, the app kept on the stand, then
   everything deleted and checked gone in Docker); otherwise the reduced tour,
   ``examples/pipeline_tour.py`` (the ``environment`` pipeline, with test objects standing in
   for containers). It says which, and why. ``--example`` picks a script instead;
2. wipes the data directory (default ``.graphene-demo/``) so every demo starts fresh;
3. starts ``graphene up`` on a free loopback port (SQLite, in-process broker, worker and
   beat threads; no GRAPHENE_DATABASE_URL/BROKER/CHANNEL settings are passed on), with the
   test kinds on (``GRAPHENE_TEST_KINDS``: the tour's records are ``test.sleep`` objects);
4. waits for ``/readyz`` (with a deadline), reads the admin token the first start wrote;
5. runs the example against it (``--url``, ``--file-root``, ``--test-world``, and
   ``GRAPHENE_TOKEN`` and ``GRAPHENE_DATA_DIR`` in its environment); the examples check every
   claim they print (resource trees while held and after, outputs, logs, the disk, Docker);
6. stops the server (SIGINT, then SIGTERM, then SIGKILL, each with a deadline).

It exits with the tour's status (non-zero also if the server fails to start or to stop).
The server's output is kept in ``<data dir>/server.log``. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ephemeral_env import prerequisites_problem

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# Settings that would switch the server away from the self-contained embedded mode.
EXTERNAL_SETTINGS = (
    "GRAPHENE_DATABASE_URL",
    "GRAPHENE_BROKER_URL",
    "GRAPHENE_CHANNEL_LAYER_URL",
    "GRAPHENE_FILE_ROOT",
    "GRAPHENE_TEST_WORLD_DIR",
    "GRAPHENE_SECRET_KEY",
    # The demo pins the local CA its server makes: no certificate from this shell.
    "GRAPHENE_TLS_CERT_FILE",
    "GRAPHENE_TLS_KEY_FILE",
    "GRAPHENE_TLS_CA_FILE",
)


def log(message: str) -> None:
    print(f"demo: {message}", file=sys.stderr, flush=True)


# Runs COMMAND with SIGINT at its default, so that SIGINT stops the server as Ctrl-C does in a
# terminal, even when this demo was started with SIGINT ignored (a background job of a
# non-interactive shell is).
WITH_DEFAULT_SIGINT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def graphene_command() -> list[str]:
    """The ``graphene`` console script of this interpreter's environment (or its module)."""
    script = Path(sys.executable).parent / "graphene"
    return [str(script)] if script.exists() else [sys.executable, "-m", "graphene_project.cli"]


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no output)"


def wait_ready(url: str, ca_file: Path, server: subprocess.Popen[bytes], deadline: float) -> str | None:
    """Poll /readyz until it answers 200 over HTTPS, trusting the server's local CA (``ca_file``,
    made on its first start) and nothing else; None when ready, else why not."""
    last = "no answer yet"
    opener = None
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return f"the server exited with status {server.returncode} before it was ready"
        if opener is None:
            if not ca_file.exists():
                time.sleep(0.1)
                continue
            context = ssl.create_default_context(cafile=str(ca_file))
            opener = urllib.request.build_opener(
                urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
            )
        try:
            with opener.open(f"{url}/readyz", timeout=5) as response:
                if response.status == 200:
                    return None
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read().decode(errors='replace')[:300]}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    return f"/readyz did not answer 200 in time (last: {last})"


def stop(server: subprocess.Popen[bytes], *, grace: float) -> str:
    """Stop the server like a user would (Ctrl-C), escalating only if it does not exit."""
    if server.poll() is not None:
        return f"already exited with status {server.returncode}"
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 10.0)):
        began = time.monotonic()
        server.send_signal(sig)
        try:
            server.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            log(f"the server did not exit within {wait:.0f}s of {sig.name}")
            continue
        return f"stopped by {sig.name} in {time.monotonic() - began:.1f}s"
    server.kill()
    server.wait(timeout=10)
    return "killed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the Graphene demo against a fresh embedded server.")
    parser.add_argument("--data-dir", default=str(ROOT / ".graphene-demo"), help="wiped at start")
    parser.add_argument("--port", type=int, default=0, help="default: a free loopback port")
    parser.add_argument("--start-timeout", type=float, default=90)
    parser.add_argument(
        "--example",
        help="the script to run against the server: it gets --url, --file-root, --test-world, GRAPHENE_TOKEN "
        "and GRAPHENE_DATA_DIR (default: ephemeral_env.py when Docker is available, else pipeline_tour.py)",
    )
    args = parser.parse_args(argv)

    started = time.monotonic()
    example = args.example
    if example is None:
        problem = prerequisites_problem(timeout=5.0)
        if problem is None:
            example = str(EXAMPLES / "ephemeral_env.py")
            log("a Docker engine answers and a static busybox and git are here: running examples/ephemeral_env.py")
        else:
            example = str(EXAMPLES / "pipeline_tour.py")
            log(f"running the reduced tour, examples/pipeline_tour.py (test objects, no containers): {problem}")
    data_dir = Path(args.data_dir).resolve()
    if data_dir == ROOT or data_dir in ROOT.parents:
        parser.error(f"refusing to wipe {data_dir}")
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    port = args.port or free_port()
    url = f"https://127.0.0.1:{port}"
    ca_file = data_dir / "tls" / "ca.pem"  # the local CA graphene up makes: the demo pins it

    env = {k: v for k, v in os.environ.items() if k not in EXTERNAL_SETTINGS}
    env |= {
        "DJANGO_SETTINGS_MODULE": "graphene_project.settings.dev",
        "GRAPHENE_DATA_DIR": str(data_dir),
        "GRAPHENE_TEST_KINDS": "1",  # the dev settings' default, whatever this shell says
        "PYTHONUNBUFFERED": "1",
    }
    server_log = data_dir / "server.log"
    command = [*graphene_command(), "up", "--host", "127.0.0.1", "--port", str(port)]
    log(f"starting embedded Graphene: {' '.join(command)} (data in {data_dir})")
    with server_log.open("wb") as out:
        server = subprocess.Popen(
            [*WITH_DEFAULT_SIGINT, *command],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    status = 1
    try:
        problem = wait_ready(url, ca_file, server, time.monotonic() + args.start_timeout)
        if problem:
            log(f"FAIL: {problem}; the server's last output:\n{tail(server_log)}")
            return 1
        log(f"server ready at {url} after {time.monotonic() - started:.1f}s (log: {server_log})")
        credentials = json.loads((data_dir / "admin-credentials.json").read_text())

        tour = [
            sys.executable,
            example,
            "--url",
            url,
            "--file-root",
            str(data_dir / "files"),
            "--test-world",
            str(data_dir / "test-world"),
        ]
        # The token goes through the environment, not argv (visible to every local user in ps).
        example_env = os.environ | {
            "GRAPHENE_TOKEN": credentials["token"],
            "GRAPHENE_DATA_DIR": str(data_dir),
            "GRAPHENE_CA_FILE": str(ca_file),
        }
        status = subprocess.run(tour, env=example_env, check=False).returncode
    finally:
        how = stop(server, grace=20.0)
        log(f"server {how}")
        if how == "killed":
            status = status or 1
    if status != 0:
        log(f"FAIL: the demo did not complete (status {status}); server log: {server_log}")
        log(f"its last lines:\n{tail(server_log, 20)}")
    else:
        log(f"done in {time.monotonic() - started:.1f}s")
        log(f"to browse what it left (tombstones, events): GRAPHENE_DATA_DIR={data_dir} make up")
    return status


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the server got the same Ctrl-C and was stopped in main's finally
        log("interrupted")
        sys.exit(130)
