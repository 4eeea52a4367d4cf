"""The ``graphene`` command: run the server in embedded or production mode.

    graphene up        one process: web, worker and beat threads (embedded default)
    graphene web       the ASGI server (daphne) only
    graphene worker    a Celery worker process
    graphene beat      the Celery beat scheduler
    graphene token     issue an API token for a user (printed once)
    graphene tls       make (or show) the local CA and server certificate, print the CA's fingerprint
    graphene manage    any ``manage.py`` command

Each command checks its settings, database and broker first and exits with status 2 and a
one-line message naming the setting to fix instead of a traceback.

TLS by default (docs/tls.md): ``up`` serves HTTPS and WSS with its local CA's certificate (or
``GRAPHENE_TLS_CERT_FILE``); ``web`` needs ``GRAPHENE_TLS_CERT_FILE``/``GRAPHENE_TLS_KEY_FILE``,
or ``GRAPHENE_TRUSTED_PROXIES`` (a TLS-terminating proxy in front), or ``--insecure``. Plain
HTTP is only ever served when asked for with ``--insecure``, and says so on stderr.
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
from pathlib import Path
from typing import Any, NoReturn

DEFAULT_SETTINGS = "graphene_project.settings.dev"
LISTEN_BACKLOG = 1024


def fail(message: str) -> NoReturn:
    print(f"graphene: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def load_settings() -> None:
    """Import the settings and set Django up; exit with one line naming the setting on failure."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", DEFAULT_SETTINGS)
    from django.core.exceptions import ImproperlyConfigured

    try:
        import django

        django.setup()
    except ImproperlyConfigured as exc:
        fail(str(exc))


def check_tls_ca() -> None:
    """``GRAPHENE_TLS_CA_FILE`` goes into agents' install data (web and workers render it):
    refuse a file that cannot be used now, not when the first agent is installed."""
    from apps.core.selectors import tls_ca_pem
    from apps.core.tls import TLSError

    try:
        tls_ca_pem()
    except TLSError as exc:
        fail(str(exc))


def setup_django(*, need_broker: bool) -> None:
    """Import settings and reach the database (and broker); exit with one line on failure."""
    load_settings()

    from apps.core import health

    checks = [health.check_database(direct=True)]
    if need_broker:
        checks.append(health.check_broker())
    for check in checks:
        if not check.ok:
            fail(f"{check.setting}: cannot reach the {check.name}: {check.detail}")


@dataclasses.dataclass(frozen=True)
class ServeTLS:
    """The certificate (with its intermediates, if any) and key a listener serves."""

    cert_file: Path
    key_file: Path
    chain_file: Path | None = None  # intermediates after the leaf, for Twisted's extraCertChain


def endpoint(*, host: str, port: int, tls: ServeTLS | None) -> str:
    """The Twisted endpoint description daphne listens on: ``tcp:`` or ``ssl:`` (pyOpenSSL)."""
    from twisted.internet.endpoints import quoteStringArgument

    interface = host.strip("[]").replace(":", r"\:")
    # Twisted listens with a backlog of 50: a burst of more connections than that overflowed the
    # kernel's accept queue, and some clients had theirs reset. 1024, as busy servers use (the
    # kernel caps it at net.core.somaxconn).
    if tls is None:
        return f"tcp:port={port}:interface={interface}:backlog={LISTEN_BACKLOG}"
    description = (
        f"ssl:port={port}:interface={interface}:backlog={LISTEN_BACKLOG}"
        f":privateKey={quoteStringArgument(str(tls.key_file))}:certKey={quoteStringArgument(str(tls.cert_file))}"
    )
    if tls.chain_file is not None:
        description += f":extraCertChain={quoteStringArgument(str(tls.chain_file))}"
    return description


def serve(*, host: str, port: int, tls: ServeTLS | None) -> None:
    """Run daphne in this thread until interrupted. Proxy headers are left to the application
    (apps/core/proxy.py: believed from GRAPHENE_TRUSTED_PROXIES only), never to daphne, whose
    own option believes them from anyone."""
    from daphne.server import Server

    from graphene_project.asgi import application

    Server(
        application=application,
        endpoints=[endpoint(host=host, port=port, tls=tls)],
        signal_handlers=True,
        server_name="graphene",
    ).run()


def warn_insecure(*, host: str, port: int) -> None:
    """Plain HTTP is a choice the operator made: say it where it cannot be missed."""
    print(
        f"graphene: WARNING: --insecure: serving PLAIN HTTP on {host}:{port}, without TLS. API tokens, "
        "passwords, session cookies and agent credentials cross the network unencrypted; anyone on the "
        "path can read and change them. Use it only on a network you trust, or put TLS in front "
        "(GRAPHENE_TLS_CERT_FILE/GRAPHENE_TLS_KEY_FILE, or a proxy in GRAPHENE_TRUSTED_PROXIES).",
        file=sys.stderr,
        flush=True,
    )


def production_tls() -> ServeTLS | None:
    """``GRAPHENE_TLS_CERT_FILE`` and ``GRAPHENE_TLS_KEY_FILE``, checked (None when neither is
    set). The intermediates after the leaf go to a file of their own for Twisted, which reads
    only the first certificate of ``certKey``."""
    import atexit
    import tempfile

    from django.conf import settings

    from apps.core.tls import TLSError, tls_files_check

    cert_file, key_file = settings.GRAPHENE_TLS_CERT_FILE, settings.GRAPHENE_TLS_KEY_FILE
    if not cert_file and not key_file:
        return None
    if not cert_file or not key_file:
        missing = "GRAPHENE_TLS_KEY_FILE" if cert_file else "GRAPHENE_TLS_CERT_FILE"
        fail(f"{missing} is not set: HTTPS needs both GRAPHENE_TLS_CERT_FILE and GRAPHENE_TLS_KEY_FILE")
    try:
        files = tls_files_check(cert_file=cert_file, key_file=key_file)
    except TLSError as exc:
        fail(str(exc))
    from datetime import UTC, datetime

    if files.expires_at <= datetime.now(UTC):
        print(
            f"graphene: WARNING: the certificate in GRAPHENE_TLS_CERT_FILE={cert_file} expired on "
            f"{files.expires_at:%Y-%m-%d}: clients will refuse it",
            file=sys.stderr,
        )
    chain_file = None
    if files.chain:
        from cryptography.hazmat.primitives import serialization

        fd, name = tempfile.mkstemp(prefix="graphene-chain-", suffix=".pem")
        with os.fdopen(fd, "wb") as out:
            out.write(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in files.chain))
        atexit.register(lambda: Path(name).unlink(missing_ok=True))
        chain_file = Path(name)
    print(
        f"graphene: TLS: certificate {cert_file} for {', '.join(sorted(files.names)) or '(no names)'}, "
        f"valid until {files.expires_at:%Y-%m-%d}",
        file=sys.stderr,
    )
    return ServeTLS(cert_file=Path(cert_file), key_file=Path(key_file), chain_file=chain_file)


def local_tls(*, host: str) -> Any:
    """The local CA and its server certificate (``apps.core.tls.tls_local_ensure``) for this
    machine's names, ``GRAPHENE_TLS_HOSTNAMES``, the host agents dial and a specific ``--host``."""
    from urllib.parse import urlsplit

    from django.conf import settings

    from apps.core.tls import TLSError, hostnames_default, tls_local_ensure

    extra = list(settings.GRAPHENE_TLS_HOSTNAMES)
    agent_host = urlsplit(settings.GRAPHENE_AGENT_SERVER_URL).hostname
    extra += [name for name in (agent_host, host) if name]
    try:
        return tls_local_ensure(directory=Path(settings.GRAPHENE_TLS_DIR), hostnames=hostnames_default(extra=extra))
    except TLSError as exc:
        fail(str(exc))


def local_tls_lines(local: Any) -> list[str]:
    """What ``up`` and ``tls`` say about the local CA: where it is and its fingerprint."""
    from datetime import UTC, datetime, timedelta

    lines = [
        f"  TLS: local CA {local.ca_path}" + (" (made now: clients and agents pin it)" if local.ca_created else ""),
        f"       CA fingerprint (SHA-256) {local.ca_fingerprint}",
        f"       server certificate for {', '.join(local.hostnames)}"
        + (f" (issued now: {local.server_issued})" if local.server_issued else ""),
    ]
    if local.ca_expires_at - datetime.now(UTC) < timedelta(days=60):
        print(
            f"graphene: WARNING: the local CA {local.ca_path} ends on {local.ca_expires_at:%Y-%m-%d}; it is not "
            f"replaced by itself: move {local.directory} away and start again to make a new one, then pin it "
            "again in every client and agent",
            file=sys.stderr,
        )
    return lines


def url_host(host: str) -> str:
    """The host as a URL shows it: a wildcard bind as 127.0.0.1, an IPv6 address in brackets."""
    host = "127.0.0.1" if host in {"0.0.0.0", "::", "[::]"} else host  # noqa: S104 - display only
    return f"[{host.strip('[]')}]" if ":" in host else host


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
    scheme = "http" if args.insecure else "https"
    url = f"{scheme}://{url_host(args.host)}:{args.port}"
    # Agents this server installs dial where it serves, unless told otherwise.
    os.environ.setdefault("GRAPHENE_AGENT_SERVER_URL", url)
    setup_django(need_broker=True)
    from django.conf import settings
    from django.core.management import call_command

    from apps.accounts.services import admin_bootstrap
    from apps.core import audit

    print(f"graphene: data directory {settings.DATA_DIR}", file=sys.stderr)
    tls = production_tls()
    local = None
    if args.insecure:
        if tls is not None:
            fail("--insecure serves plain HTTP, but GRAPHENE_TLS_CERT_FILE is set: drop one of them")
        warn_insecure(host=args.host, port=args.port)
    elif tls is None:
        local = local_tls(host=args.host)
        tls = ServeTLS(cert_file=local.cert_path, key_file=local.key_path)
    check_tls_ca()
    call_command("migrate", interactive=False, verbosity=0)
    with audit.acting(audit.who_system("graphene up")):  # the trail's actor of the first admin
        creds = admin_bootstrap(data_dir=settings.DATA_DIR)
    services = EmbeddedServices(concurrency=args.concurrency) if not args.no_worker else None
    if services is not None:
        services.start()
    lines = [
        f"Graphene is serving at {url}/ (Studio) and {url}/api/v1/ (API)"
        + (" -- PLAIN HTTP (--insecure)" if args.insecure else ""),
        f"  mode: {'embedded' if settings.GRAPHENE_EMBEDDED else 'all-in-one on external services'}",
    ]
    if local is not None:
        lines += local_tls_lines(local)
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
    pin = f" --ca-file {local.ca_path}" if local is not None else " --insecure" if args.insecure else ""
    lines.append(f"  graphenectl: jq -r .token {creds.path} | graphenectl login --server {url}{pin} --token-stdin")
    cacert = f"--cacert {local.ca_path} " if local is not None else ""
    lines.append(f"  try: curl {cacert}-H 'Authorization: Token <token>' {url}/api/v1/records/")
    print("\n".join(lines), flush=True)
    try:
        serve(host=args.host, port=args.port, tls=tls)
    finally:
        if services is not None:
            services.stop()


def cmd_web(args: argparse.Namespace) -> None:
    if args.proxy_headers:
        fail(
            "--proxy-headers is gone: it believed X-Forwarded-* headers from anyone. Set GRAPHENE_TRUSTED_PROXIES "
            "to the addresses of your TLS-terminating proxies instead"
        )
    setup_django(need_broker=True)
    from django.conf import settings

    check_tls_ca()
    tls = production_tls()
    proxies = ", ".join(str(n) for n in settings.GRAPHENE_TRUSTED_PROXIES)
    if args.insecure:
        if tls is not None:
            fail("--insecure serves plain HTTP, but GRAPHENE_TLS_CERT_FILE is set: drop one of them")
        warn_insecure(host=args.host, port=args.port)
    elif tls is None and proxies:
        print(
            f"graphene: serving HTTP for the TLS-terminating proxies at {proxies} (GRAPHENE_TRUSTED_PROXIES); "
            "their X-Forwarded-Proto/-For are believed, nobody else's",
            file=sys.stderr,
        )
    elif tls is None:
        fail(
            "no TLS configured: set GRAPHENE_TLS_CERT_FILE and GRAPHENE_TLS_KEY_FILE to serve HTTPS, or "
            "GRAPHENE_TRUSTED_PROXIES to the addresses of the TLS-terminating proxy in front, or pass --insecure "
            "to serve plain HTTP"
        )
    serve(host=args.host, port=args.port, tls=tls)


def cmd_worker(args: argparse.Namespace, extra: Sequence[str]) -> None:
    setup_django(need_broker=True)
    from django.conf import settings

    from graphene_project.celery import app

    check_tls_ca()
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
    from apps.core import audit
    from apps.core.errors import GrapheneError

    try:
        # Nobody signs in here: the trail's rows are the command's, named after it.
        with audit.acting(audit.who_system("graphene token")):
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


def cmd_tls(args: argparse.Namespace) -> None:
    """Make the local CA and server certificate unless they exist (the server certificate again
    if it nears its end or the names changed), and say where they are and the CA's fingerprint:
    what a client pins. Needs the settings only, not the database."""
    load_settings()
    local = local_tls(host="")
    local_tls_lines(local)  # the warning of a CA near its end
    print(f"CA certificate: {local.ca_path}" + (" (made now)" if local.ca_created else ""))
    print(f"CA fingerprint (SHA-256): {local.ca_fingerprint}")
    issued = f" (issued now: {local.server_issued})" if local.server_issued else ""
    print(f"server certificate: {local.cert_path}{issued}, key {local.key_path}")
    print(f"server certificate names: {', '.join(local.hostnames)}")


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
    up.add_argument(
        "--insecure",
        action="store_true",
        help="serve plain HTTP instead of HTTPS with the local CA (tokens and passwords travel unencrypted)",
    )
    web = sub.add_parser(
        "web",
        help="serve HTTPS and websockets (daphne)",
        description="Serve the API, the Studio and websockets. HTTPS with GRAPHENE_TLS_CERT_FILE and "
        "GRAPHENE_TLS_KEY_FILE; plain HTTP behind a TLS-terminating proxy whose addresses are in "
        "GRAPHENE_TRUSTED_PROXIES, or with --insecure. With none of them it refuses to start.",
    )
    # web runs behind a load balancer or in a container: listen on every interface by default.
    web.add_argument("--host", default=os.environ.get("GRAPHENE_HOST", "0.0.0.0"))  # noqa: S104
    web.add_argument("--port", type=int, default=int(os.environ.get("GRAPHENE_PORT", "8000")))
    web.add_argument(
        "--insecure", action="store_true", help="serve plain HTTP without TLS (tokens and passwords travel unencrypted)"
    )
    # Gone: it believed anyone's X-Forwarded-* headers. Kept only to say what replaces it.
    web.add_argument("--proxy-headers", action="store_true", help=argparse.SUPPRESS)
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
    sub.add_parser(
        "tls",
        help="make or show the local CA and server certificate; print the CA's fingerprint",
        description="Make the local certificate authority and a server certificate in <data dir>/tls unless "
        "they exist (what 'graphene up' does on its first start), and print where the CA is and its SHA-256 "
        "fingerprint, which clients pin (graphenectl login --ca-file / --ca-fingerprint). The server "
        "certificate is for localhost, 127.0.0.1, ::1, this machine's host name, the host of "
        "GRAPHENE_AGENT_SERVER_URL and GRAPHENE_TLS_HOSTNAMES. Needs no database.",
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
    elif args.command == "tls":
        cmd_tls(args)


if __name__ == "__main__":
    main()
