"""The web process's database connections fit it: a burst of concurrent requests of every kind
never makes ``graphene web`` hold more PostgreSQL connections than its pool's bound, and it
answers them all; when every connection stays in use past the pool's timeout, a request gets a
503 in the API's error shape (not a 500), and ``/readyz`` shows the pool's state.

Each test starts its own ``graphene web`` under the production settings: the promise is about
one process's connections, counted in ``pg_stat_activity`` by the process's application name.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from http.client import HTTPSConnection
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from rest_framework.authtoken.models import Token

from apps.core.db import closes_connections
from apps.observability.services import log_write_lines
from apps.pipelines.models import Run
from apps.records.models import Record
from tests import factories
from tests.harness import tls
from tests.harness.net import http, opener
from tests.harness.processes import REPO, process_env, purge_queue
from tests.harness.wait import wait_for
from tests.harness.web import ProductionWeb
from tests.test_foundation import assert_one_line_error, prod_env, run_graphene

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

BOUND = 5
BURST = 200


class Connections:
    """Polls ``pg_stat_activity`` on a thread of its own for the connections whose application
    name is ``name``: how many there were at most, and what they were doing."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.most = 0
        self.polls = 0
        self.rows: list[tuple[Any, ...]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=closes_connections(self._loop), name="pg-stat-activity", daemon=True)

    def now(self) -> list[tuple[Any, ...]]:
        """The process's connections now: (pid, state, wait_event_type)."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # a fresh view inside a transaction too
            cursor.execute(
                "SELECT pid, state, wait_event_type FROM pg_stat_activity WHERE application_name = %s", [self.name]
            )
            return list(cursor.fetchall())

    def _loop(self) -> None:
        while not self._stop.is_set():
            rows = self.now()
            self.polls += 1
            if len(rows) > self.most:
                self.most, self.rows = len(rows), rows
            self._stop.wait(0.005)

    def __enter__(self) -> Connections:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@pytest.fixture
def token(django_user_model: Any) -> str:
    user = django_user_model.objects.create_user(username="operator", password="pw")
    factories.bind(user, "developer")
    return Token.objects.create(user=user).key


def _web(tmp_path: Path, **env: str) -> Iterator[ProductionWeb]:
    web = ProductionWeb(tmp_path, **env).start()
    try:
        yield web
    finally:
        web.stop()
        purge_queue()  # the runs it started: no worker took them


@pytest.fixture
def bounded_web(tmp_path: Path) -> Iterator[ProductionWeb]:
    yield from _web(tmp_path, GRAPHENE_WEB_DB_POOL_MAX=str(BOUND), GRAPHENE_WEB_DB_POOL_TIMEOUT_SECONDS="30")


@pytest.fixture
def one_connection_web(tmp_path: Path) -> Iterator[ProductionWeb]:
    yield from _web(tmp_path, GRAPHENE_WEB_DB_POOL_MAX="1", GRAPHENE_WEB_DB_POOL_TIMEOUT_SECONDS="1")


def _requests(web: ProductionWeb, records: list[Record]) -> list[tuple[str, str, str, Any, int]]:
    """``BURST`` requests of mixed kinds: (kind, method, url, body, the status that answers it)."""
    api = f"{web.url}/api/v1"
    kinds = [
        ("run start", "POST", f"{api}/pipelines/sample.noop/runs/", {"inputs": {"steps": 1}}, 201),
        ("record list", "GET", f"{api}/records/?limit=20", None, 200),
        ("record get", "GET", f"{api}/records/{{id}}/", None, 200),
        ("readyz", "GET", f"{web.url}/readyz", None, 200),
        ("logs", "GET", f"{api}/records/{{id}}/logs/", None, 200),
        ("run list", "GET", f"{api}/runs/", None, 200),
    ]
    out = []
    for n in range(BURST):
        kind, method, url, body, expected = kinds[n % len(kinds)]
        out.append((kind, method, url.format(id=records[n % len(records)].pk), body, expected))
    return out


class Follower:
    """A live follow of a record's log (server-sent events) that has received its first lines:
    from then on it polls the database for as long as it stays open."""

    def __init__(self, web: ProductionWeb, record: Record, token: str) -> None:
        self.conn = HTTPSConnection("127.0.0.1", web.port, timeout=60, context=tls.context())
        self.conn.request(
            "GET",
            f"/api/v1/records/{record.pk}/logs/stream/",
            headers={"Authorization": f"Token {token}", "Accept": "text/event-stream"},
        )
        self.response = self.conn.getresponse()
        assert self.response.status == 200, self.response.read()
        received = b""
        while b"data:" not in received:
            chunk = self.response.read1(65536)
            assert chunk, f"the stream ended: {received!r}"
            received += chunk

    def close(self) -> None:
        self.conn.close()


def test_a_burst_of_200_concurrent_requests_holds_at_most_the_pools_bound_and_answers_all(
    bounded_web: ProductionWeb, token: str
) -> None:
    records = [factories.run(f"burst-{n}") for n in range(4)]
    log_write_lines(record_ids=[r.pk for r in records], lines=[f"line {n}" for n in range(50)], source="test")
    requests = _requests(bounded_web, records)
    # More live log follows than the bound, open through the burst: a follow that kept its
    # connection between polls would leave none for the requests.
    followers = [Follower(bounded_web, records[n % len(records)], token) for n in range(BOUND + 3)]
    results: list[tuple[str, int, int, float]] = []
    lock = threading.Lock()
    start = threading.Barrier(len(requests))

    def send(kind: str, method: str, url: str, body: Any, expected: int) -> None:
        start.wait(timeout=60)
        began = time.monotonic()
        try:
            status, _ = http(method, url, token=token, body=body, timeout=120)
        except OSError as exc:  # a connection refused or reset is an answer the promise forbids too
            status = -1
            print(f"{kind}: {exc!r}")
        with lock:
            results.append((kind, expected, status, time.monotonic() - began))

    threads = [threading.Thread(target=send, args=request) for request in requests]
    with Connections(bounded_web.application_name) as seen:
        began = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=180)
        elapsed = time.monotonic() - began
    for follower in followers:
        follower.close()

    latencies = sorted(seconds for *_, seconds in results)
    p50, p95 = statistics.median(latencies), latencies[int(0.95 * len(latencies)) - 1]
    print(
        f"\n{BURST} concurrent requests in {elapsed:.2f}s: at most {seen.most} connections (bound {BOUND}, "
        f"{seen.polls} polls); latency p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
        f"max {latencies[-1] * 1000:.0f} ms"
    )
    for kind in sorted({kind for kind, *_ in results}):
        times = sorted(seconds for k, _, _, seconds in results if k == kind)
        print(f"  {kind}: median {statistics.median(times) * 1000:.0f} ms, max {times[-1] * 1000:.0f} ms")
    assert len(results) == BURST, f"{BURST - len(results)} requests did not finish"
    wrong = Counter((kind, status) for kind, expected, status, _ in results if status != expected)
    assert not wrong, f"answers other than expected (kind, status): {dict(wrong)}"
    assert seen.polls > 10, "pg_stat_activity was hardly polled during the burst"
    assert 1 <= seen.most <= BOUND, f"the web held {seen.most} connections (bound {BOUND}): {seen.rows}"
    assert Run.objects.filter(pipeline__name="sample.noop").count() == BURST // 6 + (BURST % 6 > 0)

    status, ready = http("GET", f"{bounded_web.url}/readyz")
    assert status == 200, ready
    pool = ready["database_pool"]
    assert pool["max"] == BOUND
    assert pool["size"] <= BOUND
    api_requests = sum(1 for kind, *_ in requests if kind != "readyz")
    assert pool["requests"] >= api_requests  # every API request borrowed from the pool
    assert pool["queued"] > 0, pool  # and the bound held them back: more wanted one than it allows
    assert pool["errors"] == 0, pool
    print(f"  pool after the burst: {pool}")


def test_a_request_that_finds_every_connection_in_use_past_the_timeout_answers_503_json(
    one_connection_web: ProductionWeb, token: str
) -> None:
    web = one_connection_web
    root = factories.run("held")
    watch = Connections(web.application_name)
    answers: list[tuple[int, Any]] = []
    with transaction.atomic():
        # The deletion locks the run's tree root: while this transaction holds the row, the
        # deleting request waits on the lock, holding the pool's only connection.
        Record.objects.select_for_update().get(pk=root.pk)
        holder = threading.Thread(
            target=lambda: answers.append(http("DELETE", f"{web.url}/api/v1/records/{root.pk}/", token=token))
        )
        holder.start()
        wait_for(
            lambda: any(wait == "Lock" for _, _, wait in watch.now()),
            timeout=30,
            what="the deleting request to wait on the row lock",
        )

        began = time.monotonic()
        request = urllib.request.Request(  # noqa: S310 - https:// on loopback
            f"{web.url}/api/v1/records/", headers={"Authorization": f"Token {token}", "Accept": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            opener.open(request, timeout=30)
        waited = time.monotonic() - began
        error = refused.value
        body = error.read()
        assert error.code == 503, body
        assert error.headers["Content-Type"] == "application/json"
        assert error.headers["Retry-After"] == "1"
        answer = json.loads(body)
        assert set(answer) == {"error", "detail", "fields"}
        assert answer["error"] == "database_busy"
        assert "GRAPHENE_WEB_DB_POOL_MAX=1" in answer["detail"]
        assert 1.0 <= waited < 10, f"answered after {waited:.2f}s; the pool's timeout is 1 s"

        # /readyz: busy is not unready (the probe does not queue), and the pool's state shows it.
        status, ready = http("GET", f"{web.url}/readyz")
        assert status == 200, ready
        assert "1 of 1 connections in use" in ready["checks"]["database"]["detail"]
        assert ready["database_pool"]["in_use"] == 1
        assert ready["database_pool"]["max"] == 1
        assert ready["database_pool"]["errors"] == 1  # the API request that timed out
    holder.join(timeout=30)
    assert [status for status, _ in answers] == [202]
    status, ready = http("GET", f"{web.url}/readyz")
    assert status == 200, ready
    assert ready["database_pool"]["in_use"] == 0


def _settings_of(code: str, **env: str) -> dict[str, Any]:
    """The default database's settings in a fresh process that runs ``code`` first."""
    show = (
        "from django.conf import settings; import json; print(json.dumps(settings.DATABASES['default'], default=str))"
    )
    probe = f"{code}; {show}"
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        env=process_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_a_process_serving_asgi_pools_its_connections_and_workers_keep_theirs() -> None:
    web = _settings_of("import graphene_project.asgi", GRAPHENE_WEB_DB_POOL_MAX="7")
    assert web["CONN_MAX_AGE"] == 0  # Django's pool refuses persistent connections
    assert web["OPTIONS"]["pool"] == {"min_size": 2, "max_size": 7, "timeout": 10.0, "name": "graphene-web"}

    for name in ("worker", "beat"):
        kept = _settings_of(
            f"from graphene_project import process; process.declare({name!r}); import django; django.setup()"
        )
        assert kept["CONN_MAX_AGE"] == 60
        assert "pool" not in kept["OPTIONS"]

    # A process nobody named (celery -A graphene_project, manage.py) keeps its connections too;
    # the URL's options reach the connection.
    url = process_env()["GRAPHENE_DATABASE_URL"] + "?application_name=mine&conn_max_age=30"
    plain = _settings_of("import django; django.setup()", GRAPHENE_DATABASE_URL=url)
    assert plain["CONN_MAX_AGE"] == 30
    assert "pool" not in plain["OPTIONS"]
    assert plain["OPTIONS"]["application_name"] == "mine"


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"GRAPHENE_WEB_DB_POOL_MAX": "0"}, "GRAPHENE_WEB_DB_POOL_MAX=0 must be at least 1"),
        (
            {"GRAPHENE_WEB_DB_POOL_MAX": "4", "GRAPHENE_WEB_DB_POOL_MIN": "5"},
            "GRAPHENE_WEB_DB_POOL_MIN=5 must be between",
        ),
        ({"GRAPHENE_WEB_DB_POOL_TIMEOUT_SECONDS": "0"}, "GRAPHENE_WEB_DB_POOL_TIMEOUT_SECONDS=0 must be at least 1"),
        ({"GRAPHENE_WEB_DB_POOL_MAX": "many"}, "GRAPHENE_WEB_DB_POOL_MAX='many' is not an integer"),
    ],
)
def test_a_pool_bound_that_cannot_work_stops_graphene_web_at_once(
    env: dict[str, str], says: str, tmp_path: Path
) -> None:
    line = assert_one_line_error(run_graphene(["web", "--port", "1"], prod_env(tmp_path, **env)), says.split("=")[0])
    assert says in line
