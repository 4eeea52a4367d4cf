"""Benchmark: log lines from an agent command into stored logs and to a live subscriber.

A real agent (the shipped zipapp, on loopback to a real daphne with the Redis channel layer)
runs an ``exec`` of the base Python printing numbered lines that carry the time they were
produced (``<n> <time.time()> compiling unit ...``, ~60 bytes). The lines travel as the
product does it: the agent's pipe reader and output chunks, the websocket, the gateway's
``command_output`` (one transaction per chunk: ``LogLine`` rows, then the acknowledgement),
and out again through the REST API's log stream (server-sent events,
``/api/v1/records/<id>/logs/stream/``) that a subscriber (``graphenectl logs -f``, the Studio)
follows — here a client thread in this process, with an API token.

Two phases, each checked (exactly the lines produced, each stored once, none missing; the
subscriber saw all of them in order):

* **burst**: ``--lines`` (400,000: ~28 MB, under the 32 MiB of unacknowledged output an agent
  keeps before it drops the oldest) as fast as the producer can print them. ``lines_per_s`` =
  lines / (last line stored - first line produced): the stored throughput. The subscriber's
  rate over the same window is ``live_lines_per_s``.
* **paced**: ``--rate`` (50,000) lines per second for ``--seconds`` (6), written every 5 ms —
  the goal rate. ``lag_s`` = the subscriber's p95 of (seen - produced); ``stored_lag_s`` the
  same for the stored row's ``at`` (its transaction's time); both with p50 and max in the
  detail line.

    .venv/bin/python bench/agent_logs.py [--lines 400000] [--rate 50000] [--seconds 6]

Last line: ``lines_per_s=<x> lag_s=<y> live_lines_per_s=.. stored_lag_s=..``
(goal: ``lines_per_s`` >= 50,000 with ``lag_s`` under 1).
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._agents_common import AgentProc, Web, base_interpreter, process_cpu_seconds
from bench._common import figures, load_1m, log, wait_until
from bench._runs_common import percentile, runs_environment

NAME = "agent_logs"
TEXT = "compiling unit {u} of the benchmark target: ok"

BURST = """
import sys, time
w = sys.stdout.write
for i in range({n}):
    w(f"{{i:07d}} {{time.time():.6f}} {text}\\n")
"""

PACED = """
import sys, time
rate, total = {rate}, {n}
start = time.time()
i = 0
while i < total:
    due = min(total, int((time.time() - start) * rate) + 1)
    if due > i:
        now = time.time()
        sys.stdout.write("".join(f"{{j:07d}} {{now:.6f}} {text}\\n" for j in range(i, due)))
        sys.stdout.flush()
        i = due
    time.sleep(0.005)
"""


def script(template: str, **values: Any) -> str:
    return template.format(text=TEXT.replace("{u}", "{i % 997}" if template is BURST else "{j % 997}"), **values)


@dataclass
class Subscriber:
    """Follows the record's log stream (SSE) in a thread; keeps (index, produced, seen) per line."""

    port: int
    token: str
    record_id: str
    after: int
    seen: list[tuple[int, float, float]] = field(default_factory=list)
    last_id: int = 0
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _connected: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Subscriber:
        self._thread = threading.Thread(target=self._run, name="sse-subscriber", daemon=True)
        self._thread.start()
        if not self._connected.wait(30):
            raise TimeoutError(f"the log stream did not answer in 30 s ({self.error})")
        return self

    def _run(self) -> None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            path = f"/api/v1/records/{self.record_id}/logs/stream/?descendants=false&after={self.after}"
            conn.request("GET", path, headers={"Authorization": f"Token {self.token}", "Accept": "text/event-stream"})
            response = conn.getresponse()
            if response.status != 200:
                raise RuntimeError(f"log stream: HTTP {response.status}: {response.read()[:500]!r}")
            self._connected.set()
            # Whole blocks, split into events here: reading the stream line by line with
            # http.client cost ~20 us a line of this process's time, and was what limited
            # the subscriber (a browser's EventSource parses in native code).
            rest = b""
            while not self._stop.is_set():
                block = response.read1(1 << 16)
                if not block:
                    raise RuntimeError("the log stream ended")
                now = time.time()
                complete, _sep, rest = (rest + block).rpartition(b"\n\n")
                for field in complete.split(b"\n"):
                    if not field.startswith(b"data: "):
                        continue
                    line = json.loads(field[6:])
                    index, produced, _rest = line["message"].split(" ", 2)
                    self.seen.append((int(index), float(produced), now))
                    self.last_id = int(line["id"])
        except BaseException as exc:  # reported by the main thread
            self.error = exc
            self._connected.set()

    def take(self) -> list[tuple[int, float, float]]:
        taken, self.seen = self.seen, []
        return taken

    def stop(self) -> None:
        self._stop.set()


def run_command(agent: AgentProc, source: str, *, timeout: float) -> Any:
    from apps.agents import services
    from apps.agents.models import AgentCommand

    command = services.command_submit(
        agent=agent.record, kind="exec", payload={"argv": [base_interpreter(), "-c", source], "timeout": timeout}
    )
    wait_until(
        lambda: AgentCommand.objects.filter(pk=command.pk, finished_at__isnull=False).exists(),
        timeout=timeout + 60,
        interval=0.1,
        what=f"command {command.pk} to finish",
    )
    done = AgentCommand.objects.get(pk=command.pk)
    if done.status != "succeeded" or done.result.get("output_incomplete") or done.result.get("dropped_chunks"):
        raise RuntimeError(f"command {command.pk}: {done.status} {done.error} {done.result}")
    return done


def stored(command: Any, expected: int) -> dict[str, float]:
    """Check the command's stored lines (each index once, none missing) and time them."""
    from django.db import connection

    source = f"command/{command.pk}"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), min(message) FROM observability_logline"
            " WHERE record_id = %s AND source = %s AND message !~ '^[0-9]{7} [0-9]+[.][0-9]+ '",
            [command.agent_id, source],
        )
        broken, example = cursor.fetchone()
        if broken:
            raise RuntimeError(f"{broken} stored lines are not whole lines (a line cut in two?), e.g. {example!r}")
        cursor.execute(
            """
            SELECT count(*), count(DISTINCT split_part(message, ' ', 1)),
                   min(split_part(message, ' ', 1)::int), max(split_part(message, ' ', 1)::int),
                   min(split_part(message, ' ', 2)::float8),
                   extract(epoch FROM max(at))::float8,
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), percentile_cont(0.95) WITHIN GROUP (ORDER BY lag),
                   max(lag), count(DISTINCT at)
            FROM (
                SELECT message, at, extract(epoch FROM at)::float8 - split_part(message, ' ', 2)::float8 AS lag
                FROM observability_logline WHERE record_id = %s AND source = %s
            ) AS lines
            """,
            [command.agent_id, source],
        )
        count, distinct, lo, hi, first_produced, last_at, lag50, lag95, lagmax, chunks = cursor.fetchone()
    if (count, distinct, lo, hi) != (expected, expected, 0, expected - 1):
        raise RuntimeError(f"stored lines: {count} rows, {distinct} distinct, {lo}..{hi}; expected {expected}")
    return {
        "seconds": last_at - first_produced,
        "lines_per_s": expected / (last_at - first_produced),
        "lag_p50": lag50,
        "lag_p95": lag95,
        "lag_max": lagmax,
        "chunks": chunks,
    }


def live(subscriber: Subscriber, expected: int, *, timeout: float = 120) -> list[tuple[int, float, float]]:
    """Wait until the subscriber has seen ``expected`` lines; check they are 0..n-1 in order."""
    wait_until(
        lambda: subscriber.error is not None or len(subscriber.seen) >= expected,
        timeout=timeout,
        interval=0.05,
        what=f"the subscriber to see {expected} lines",
    )
    if subscriber.error is not None:
        raise RuntimeError(f"the subscriber failed: {subscriber.error!r}")
    seen = subscriber.take()
    if [i for i, _p, _s in seen] != list(range(expected)):
        raise RuntimeError(f"the subscriber saw {len(seen)} lines, not 0..{expected - 1} in order")
    return seen


def database_cpu_seconds() -> dict[int, float]:
    """CPU so far of each PostgreSQL backend serving the benchmark's database (a local server),
    but this process's own (its checks are not the product's work)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return {pid: process_cpu_seconds(pid) for (pid,) in cursor.fetchall()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=400_000)
    parser.add_argument("--rate", type=int, default=50_000)
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()

    web = agent = subscriber = None
    with runs_environment(NAME, redis_db=6) as bench:
        try:
            from django.contrib.auth import get_user_model

            from apps.accounts.services import access_token_issue
            from apps.observability.models import LogLine

            web = Web(bench).start()
            agent = AgentProc.declare_and_start(bench, web, name="logs-bench")
            user = get_user_model().objects.create_superuser("bench", password="bench")  # noqa: S106
            token = access_token_issue(user=user).key
            assert web.proc is not None
            assert agent.proc is not None
            log(f"web on {web.url}, agent {agent.record.pk} ready")

            warm = run_command(agent, script(BURST, n=20_000), timeout=120)  # warm-up: imports, plans, caches
            after = LogLine.objects.filter(record_id=agent.record.pk).order_by("-id").values_list("id", flat=True)[0]
            subscriber = Subscriber(web.port, token, str(agent.record.pk), after).start()
            log(f"warm-up done ({warm.output_seq} chunks); subscriber following after line {after}")

            cpu0 = (process_cpu_seconds(web.proc.pid), process_cpu_seconds(agent.proc.pid))
            db0 = database_cpu_seconds()
            burst_cmd = run_command(agent, script(BURST, n=args.lines), timeout=600)
            seen = live(subscriber, args.lines)
            # CPU after the subscriber saw every line (the stream's share counted whole), and
            # before this process's own checks below (its backend is not counted either).
            cpu1 = (process_cpu_seconds(web.proc.pid), process_cpu_seconds(agent.proc.pid))
            db1 = database_cpu_seconds()
            db_cpu = sum(cpu - db0.get(pid, 0.0) for pid, cpu in db1.items())
            burst = stored(burst_cmd, args.lines)
            first_produced = min(p for _i, p, _s in seen)
            live_rate = args.lines / (max(s for _i, _p, s in seen) - first_produced)
            log(
                f"burst: {args.lines} lines stored in {burst['seconds']:.2f}s ({burst['lines_per_s']:.0f}/s, "
                f"{burst['chunks']} chunks); subscriber {live_rate:.0f}/s; load {load_1m():.2f}"
            )

            paced_n = int(args.rate * args.seconds)
            paced_cmd = run_command(agent, script(PACED, n=paced_n, rate=args.rate), timeout=args.seconds + 120)
            paced = stored(paced_cmd, paced_n)
            lags = [s - p for _i, p, s in live(subscriber, paced_n)]
            log(
                f"paced {args.rate}/s: subscriber lag p50 {percentile(lags, 50):.3f}s p95 {percentile(lags, 95):.3f}s "
                f"max {max(lags):.3f}s; stored lag p95 {paced['lag_p95']:.3f}s; load {load_1m():.2f}"
            )
        finally:
            if subscriber is not None:
                subscriber.stop()
            for proc in (agent, web):
                if proc is not None:
                    proc.stop()

    print(
        "detail: "
        f"burst_lines={args.lines} burst_s={burst['seconds']:.2f} burst_chunks={burst['chunks']} "
        f"burst_stored_lag_max_s={burst['lag_max']:.2f} "
        f"web_cpu_us_per_line={(cpu1[0] - cpu0[0]) * 1e6 / args.lines:.1f} "
        f"agent_cpu_us_per_line={(cpu1[1] - cpu0[1]) * 1e6 / args.lines:.1f} "
        f"db_cpu_us_per_line={db_cpu * 1e6 / args.lines:.1f} "
        f"paced_rate={args.rate} paced_lines={paced_n} lag_p50_s={percentile(lags, 50):.3f} "
        f"lag_max_s={max(lags):.3f} stored_lag_p50_s={paced['lag_p50']:.3f} stored_lag_max_s={paced['lag_max']:.3f} "
        f"load_1m={load_1m():.2f}",
        flush=True,
    )
    figures(
        {
            "lines_per_s": burst["lines_per_s"],
            "lag_s": percentile(lags, 95),
            "live_lines_per_s": live_rate,
            "stored_lag_s": paced["lag_p95"],
        }
    )


if __name__ == "__main__":
    main()
