"""The ``graphene`` command: run the server in embedded or production mode.

    graphene up        one process: web, worker and beat threads (embedded default)
    graphene web       the ASGI server (daphne) only
    graphene worker    a Celery worker process
    graphene beat      the Celery beat scheduler
    graphene token     issue an API token for a user (printed once)
    graphene manage    any ``manage.py`` command

Each command checks its settings, database and broker first and exits with status 2 and a
one-line message naming the setting to fix instead of a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

DEFAULT_SETTINGS = "graphene_project.settings.dev"
LISTEN_BACKLOG = 1024


def fail(message: str) -> NoReturn:
    print(f"graphene: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def setup_django(*, need_broker: bool) -> None:
    """Import settings and reach the database (and broker); exit with one line on failure."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", DEFAULT_SETTINGS)
    from django.core.exceptions import ImproperlyConfigured

    try:
        import django

        django.setup()
    except ImproperlyConfigured as exc:
        fail(str(exc))

    from apps.core import health

    checks = [health.check_database(direct=True)]
    if need_broker:
        checks.append(health.check_broker())
    for check in checks:
        if not check.ok:
            fail(f"{check.setting}: cannot reach the {check.name}: {check.detail}")


def serve(*, host: str, port: int, proxy_headers: bool) -> None:
    """Run daphne in this thread until interrupted."""
    from daphne.endpoints import build_endpoint_description_strings
    from daphne.server import Server

    from graphene_project.asgi import application

    # Twisted listens with a backlog of 50: a burst of more connections than that overflowed the
    # kernel's accept queue, and some clients had theirs reset. 1024, as busy servers use (the
    # kernel caps it at net.core.somaxconn).
    endpoints = [f"{e}:backlog={LISTEN_BACKLOG}" for e in build_endpoint_description_strings(host=host, port=port)]
    Server(
        application=application,
        endpoints=endpoints,
        signal_handlers=True,
        server_name="graphene",
        proxy_forwarded_address_header="X-Forwarded-For" if proxy_headers else None,
        proxy_forwarded_port_header="X-Forwarded-Port" if proxy_headers else None,
        proxy_forwarded_proto_header="X-Forwarded-Proto" if proxy_headers else None,
    ).run()


class EmbeddedServices:
    """The Celery worker and beat scheduler as threads of this process (embedded mode)."""

    def __init__(self, *, concurrency: int) -> None:
        from celery.beat import EmbeddedService
        from celery.worker import WorkController
        from django.conf import settings

        from graphene_project.celery import app

        self.worker = WorkController(
            app=app,
            pool="threads",
            concurrency=concurrency,
            hostname=f"embedded@{socket.gethostname()}",
            queues=[settings.CELERY_TASK_DEFAULT_QUEUE],
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            loglevel="WARNING",
        )
        self.beat: Any = EmbeddedService(app, thread=True, schedule_filename=settings.CELERY_BEAT_SCHEDULE_FILENAME)
        self._thread = threading.Thread(target=self.worker.start, name="graphene-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self.beat.start()

    def stop(self) -> None:
        self.beat.stop()
        self.worker.stop(in_sighandler=False)
        self._thread.join(timeout=10)


def cmd_up(args: argparse.Namespace) -> None:
    setup_django(need_broker=True)
    from django.conf import settings
    from django.core.management import call_command

    from apps.accounts.services import admin_bootstrap

    print(f"graphene: data directory {settings.DATA_DIR}", file=sys.stderr)
    call_command("migrate", interactive=False, verbosity=0)
    creds = admin_bootstrap(data_dir=settings.DATA_DIR)
    services = EmbeddedServices(concurrency=args.concurrency) if not args.no_worker else None
    if services is not None:
        services.start()
    display_host = "127.0.0.1" if args.host in {"0.0.0.0", "::"} else args.host  # noqa: S104 - display only
    url = f"http://{display_host}:{args.port}"
    lines = [
        f"Graphene is serving at {url}/ (Studio) and {url}/api/v1/ (API)",
        f"  mode: {'embedded' if settings.GRAPHENE_EMBEDDED else 'all-in-one on external services'}",
    ]
    if creds.created:
        lines += [
            f"  first start: created user {creds.username!r} with password {creds.password}",
            f"  API token: {creds.token} (expires {creds.token_expires_at})",
            f"  (both saved in {creds.path}, mode 0600)",
        ]
    else:
        lines.append(f"  log in as {creds.username!r}; the first start saved its credentials in {creds.path}")
        if creds.renewed:
            lines.append(
                f"  the saved API token no longer authenticated: it now holds a new one "
                f"(expires {creds.token_expires_at})"
            )
    lines.append(f"  try: curl -H 'Authorization: Token <token>' {url}/api/v1/records/")
    print("\n".join(lines), flush=True)
    try:
        serve(host=args.host, port=args.port, proxy_headers=False)
    finally:
        if services is not None:
            services.stop()


def cmd_web(args: argparse.Namespace) -> None:
    setup_django(need_broker=True)
    serve(host=args.host, port=args.port, proxy_headers=args.proxy_headers)


def cmd_worker(args: argparse.Namespace, extra: Sequence[str]) -> None:
    setup_django(need_broker=True)
    from django.conf import settings

    from graphene_project.celery import app

    argv = ["worker", "--loglevel", args.loglevel, "-Q", settings.CELERY_TASK_DEFAULT_QUEUE]
    if args.concurrency:
        argv += ["--concurrency", str(args.concurrency)]
    app.worker_main([*argv, *extra])


def cmd_beat(args: argparse.Namespace, extra: Sequence[str]) -> None:
    setup_django(need_broker=True)
    from django.conf import settings

    from graphene_project.celery import app

    app.start(["beat", "--loglevel", args.loglevel, "-s", settings.CELERY_BEAT_SCHEDULE_FILENAME, *extra])


def cmd_token(args: argparse.Namespace) -> None:
    """Print a new API token of USERNAME alone on stdout (for ``TOKEN=$(graphene token admin)``);
    what this call changed goes to stderr."""
    from graphenectl._errors import UsageError
    from graphenectl._time import parse_duration

    try:
        expires_in = parse_duration(args.expires_in, option="--expires-in") if args.expires_in else None
    except UsageError as exc:
        fail(exc.message)
    setup_django(need_broker=False)
    from datetime import timedelta

    from apps.accounts.services import user_token_issue
    from apps.core.errors import GrapheneError

    try:
        issued = user_token_issue(
            username=args.username,
            create_user=args.create_user,
            rotate=args.rotate,
            expires_in=timedelta(seconds=expires_in) if expires_in else None,
            comment=args.comment,
        )
    except GrapheneError as exc:
        fail(exc.detail)
    if args.output == "json":
        print(json.dumps(dataclasses.asdict(issued)))
    else:
        print(issued.token)
    notes = []
    if issued.created_user:
        notes.append(f"created user {issued.username!r} (API only: no password, not staff)")
    notes.append(
        f"issued a token for {issued.username!r} (id {issued.id}), valid until {issued.expires_at}: "
        "it is shown only now"
    )
    if issued.revoked:
        notes.append(f"revoked {issued.username!r}'s {issued.revoked} earlier token(s): they no longer authenticate")
    for note in notes:
        print(f"graphene: {note}", file=sys.stderr)


def cmd_manage(extra: Sequence[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", DEFAULT_SETTINGS)
    if extra[:1] == ["migrate"]:
        setup_django(need_broker=False)  # a wrong database URL: one line, not a traceback
    from django.core.management import execute_from_command_line

    execute_from_command_line(["graphene manage", *extra])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graphene",
        description="Run the Graphene control plane. Settings come from GRAPHENE_* environment variables; "
        "with none set, 'up' runs embedded (SQLite under GRAPHENE_DATA_DIR, in-process broker).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    up = sub.add_parser("up", help="migrate, create the admin on first start, serve web+worker+beat in one process")
    up.add_argument("--host", default=os.environ.get("GRAPHENE_HOST", "127.0.0.1"))
    up.add_argument("--port", type=int, default=int(os.environ.get("GRAPHENE_PORT", "8000")))
    up.add_argument("--concurrency", type=int, default=4, help="worker threads (default 4)")
    up.add_argument("--no-worker", action="store_true", help="serve only; run 'graphene worker' separately")
    web = sub.add_parser("web", help="serve HTTP and websockets (daphne)")
    # web runs behind a load balancer or in a container: listen on every interface by default.
    web.add_argument("--host", default=os.environ.get("GRAPHENE_HOST", "0.0.0.0"))  # noqa: S104
    web.add_argument("--port", type=int, default=int(os.environ.get("GRAPHENE_PORT", "8000")))
    web.add_argument("--proxy-headers", action="store_true", help="trust X-Forwarded-* from a reverse proxy")
    worker = sub.add_parser("worker", help="run a Celery worker (extra arguments go to celery)")
    worker.add_argument("--concurrency", type=int, default=0)
    worker.add_argument("--loglevel", default="INFO")
    beat = sub.add_parser("beat", help="run the periodic scheduler (TTL, retries, sweeps)")
    beat.add_argument("--loglevel", default="INFO")
    token = sub.add_parser(
        "token",
        help="issue a new API token for a user and print it (once)",
        description="Issue a new API token for USERNAME and print it alone on stdout, for the REST API, "
        "graphenectl and the SDK ('Authorization: Token <token>'). Each call issues another token: only its "
        "digest is stored, so no token can be shown again. Tokens expire (default GRAPHENE_USER_TOKEN_TTL_DAYS "
        "days); --rotate also revokes the user's earlier tokens. Needs the database only.",
    )
    token.add_argument("username", metavar="USERNAME")
    token.add_argument(
        "--create-user",
        action="store_true",
        help="create USERNAME if missing, as an API-only account (no password, not staff)",
    )
    token.add_argument(
        "--rotate", action="store_true", help="also revoke the user's earlier tokens: they stop working at once"
    )
    token.add_argument(
        "--expires-in",
        metavar="DURATION",
        help="how long it is valid: 90d, 12h, 30m (default GRAPHENE_USER_TOKEN_TTL_DAYS days; "
        "at most GRAPHENE_TOKEN_MAX_TTL_DAYS)",
    )
    token.add_argument("--comment", default="", help="what it is for (shown in token lists)")
    token.add_argument(
        "-o", "--output", choices=["text", "json"], default="text", help="text: the token alone (default); json"
    )
    sub.add_parser("manage", help="run a manage.py command, e.g. 'graphene manage migrate'", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    from graphene_project import process

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["manage"]:
        process.declare(process.MANAGE)
        cmd_manage(argv[1:])
        return
    args, extra = build_parser().parse_known_args(argv)
    # Before the settings load: they choose the database connections by process (web: a pool).
    process.declare(args.command)
    if args.command == "worker":
        cmd_worker(args, extra)
    elif args.command == "beat":
        cmd_beat(args, extra)
    elif extra:
        build_parser().error(f"unrecognized arguments: {' '.join(extra)}")
    elif args.command == "up":
        cmd_up(args)
    elif args.command == "web":
        cmd_web(args)
    elif args.command == "token":
        cmd_token(args)


if __name__ == "__main__":
    main()
