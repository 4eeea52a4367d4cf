"""Benchmark: a ``docker.container`` create through an agent, against the same create on the
server's own engine, measured in the same run.

Both creates are the same record: ``docker.container`` of the busybox test image
(``tests/harness/docker.py``: a root file system imported with ``docker import``, nothing
pulled), ``command: sh -c "echo up; exec sleep 600"``, ``ready_when: {log: "^up$"}``,
``pull: never``. One declares it on the server's engine (owner: a stand); the other with
``agent`` in its spec (owner: the agent record), so that the engine is reached through a real
agent — the shipped zipapp run by the base interpreter, dialling a real daphne over a loopback
websocket, with the Redis channel layer as in production — whose machine is this one (the same
dockerd). One Celery worker (prefork, 2 processes, the bench settings) converges both.

A create's time runs from its ``declared`` event to its ``phase_changed`` event to ``ready``
(both written by the server, one clock): the convergence task's dispatch, adopt-or-create
(list by label, inspect the image, create, start, inspect), the readiness wait (inspect and
logs until the line is there) and the log copy. Each record is deleted and waited for
(``deleted``) before the next declaration. The two are interleaved (local, agent, local, ...)
so that load changes hit them alike; ``--warmup`` (2) rounds are discarded, ``--n`` (20)
measured.

The commands the agent's creates left are counted (``commands_per_create``: a request sent
as a ``call`` command leaves a row; a live call leaves none) and, if any, split (medians):
from the row's creation to the agent's start, the agent's own run, the rest until the row
is finished. One engine request alone is timed too, ``--pings`` (50) times each:
``GET /_ping`` through the agent (``machines().request`` of ``_engine_http.engine_http``, as
the kinds send it) and the same function called here against the engine's socket.

    .venv/bin/python bench/docker_on_agent.py [--n 20]

Last line: ``local_p50_ms=<x> agent_p50_ms=<y> ratio_vs_local=<y/x>`` (p50s) and the p95s
(goal: ``ratio_vs_local`` <= 1.5).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._agents_common import AgentProc, Web
from bench._common import figures, load_1m, log, stop_workers, wait_until, wait_workers_ready
from bench._runs_common import percentile, runs_environment, start_run_workers

NAME = "docker_on_agent"
SPEC = {
    "command": ["sh", "-c", "echo up; exec sleep 600"],
    "ready_when": {"log": "^up$"},
    "pull": "never",
}


def wait_phase(record_id: Any, phase: str, *, timeout: float) -> Any:
    from apps.records.models import Record

    found: list[Any] = []

    def reached() -> bool:
        row = Record.objects.filter(pk=record_id).values("phase", "last_error").get()
        if row["phase"] in ("create_failed", "delete_failed") and row["phase"] != phase:
            raise RuntimeError(f"record {record_id} is {row['phase']}: {row['last_error']}")
        found.append(row)
        return bool(row["phase"] == phase)

    wait_until(reached, timeout=timeout, interval=0.01, what=f"record {record_id} to be {phase}")
    return found[-1]


def create_ms(record_id: Any) -> float:
    """From the record's ``declared`` event to its ``phase_changed`` event to ``ready``."""
    from apps.records.models import Event

    declared = Event.objects.get(record_id=record_id, type="declared").created_at
    ready = (
        Event.objects.filter(record_id=record_id, type="phase_changed", data__to="ready")
        .order_by("id")
        .values_list("created_at", flat=True)
        .first()
    )
    assert ready is not None
    return float((ready - declared).total_seconds() * 1000)


def commands_of(record_id: Any) -> list[dict[str, Any]]:
    from apps.agents.models import AgentCommand

    rows = AgentCommand.objects.filter(waiting_record_id=record_id).order_by("created_at")
    fields = ("kind", "operation", "status", "created_at", "sent_at", "started_at", "finished_at", "result")
    return [dict(row) for row in rows.values(*fields)]


def one_create(owner: Any, image: str, *, agent: Any | None, index: int) -> dict[str, Any]:
    from apps.records import services as records

    spec: dict[str, Any] = {"image": image, **SPEC}
    if agent is not None:
        spec["agent"] = str(agent.pk)
    where = "agent" if agent is not None else "local"
    record = records.record_declare(kind="docker.container", name=f"{where}{index}", owner=owner, spec=spec)
    wait_phase(record.pk, "ready", timeout=120)
    ms = create_ms(record.pk)
    commands = commands_of(record.pk) if agent is not None else []
    records.record_delete_request(record=record)
    wait_phase(record.pk, "deleted", timeout=120)
    return {"ms": ms, "commands": commands}


def pings(agent: Any, count: int) -> tuple[list[float], list[float]]:
    """``GET /_ping`` through the agent and directly, interleaved: (agent ms, local ms)."""
    from kinds.docker._engine_http import engine_http
    from kinds.machine import Call, machines

    kwargs: dict[str, Any] = {"op": "request", "token": "bench", "method": "GET", "path": "/_ping", "timeout": 10.0}
    far, near = [], []
    for _ in range(count):
        t0 = time.perf_counter()
        answer = machines().request(
            agent,
            str(agent.pk),
            "docker",
            Call(engine_http, kwargs=kwargs, in_process=True),
            purpose="observe",
            timeout=10,
        )
        t1 = time.perf_counter()
        local = engine_http(**kwargs)
        t2 = time.perf_counter()
        if answer.get("status") != 200 or local.get("status") != 200:
            raise RuntimeError(f"ping: {answer} / {local}")
        far.append((t1 - t0) * 1000)
        near.append((t2 - t1) * 1000)
    return far, near


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--pings", type=int, default=50)
    args = parser.parse_args()

    local: list[float] = []
    through: list[float] = []
    per_create: list[int] = []
    kinds: set[str] = set()
    to_running: list[float] = []
    on_agent: list[float] = []
    back: list[float] = []
    web = agent = workers = None
    with runs_environment(NAME, redis_db=4) as bench:
        try:
            from apps.records.services import record_create_root
            from tests.harness.docker import busybox_image, busybox_rootfs_tar, client

            image = busybox_image(client(), busybox_rootfs_tar(bench.data_dir))
            web = Web(bench).start()
            agent = AgentProc.declare_and_start(bench, web, name="docker-bench")
            workers = start_run_workers(bench, count=1, concurrency=2)
            wait_workers_ready(workers)
            stand = record_create_root(kind="graphene.stand", name=f"bench-docker-{time.monotonic_ns()}")
            log(f"web on {web.url}, agent {agent.record.pk} ready, image {image}")
            for i in range(args.warmup + args.n):
                near = one_create(stand, image, agent=None, index=i)
                far = one_create(agent.record, image, agent=agent.record, index=i)
                if i >= args.warmup:
                    local.append(near["ms"])
                    through.append(far["ms"])
                    per_create.append(len(far["commands"]))
                    for command in far["commands"]:
                        kinds.add(f"{command['kind']}:{command['operation']}")
                        if command["started_at"] is None or command["finished_at"] is None:
                            continue
                        run_ms = float(command["result"].get("duration_s") or 0.0) * 1000
                        started = (command["started_at"] - command["created_at"]).total_seconds() * 1000
                        total = (command["finished_at"] - command["created_at"]).total_seconds() * 1000
                        to_running.append(started)
                        on_agent.append(run_ms)
                        back.append(total - started - run_ms)
                log(
                    f"{i + 1}/{args.warmup + args.n}: local {near['ms']:.0f} ms, agent {far['ms']:.0f} ms "
                    f"({len(far['commands'])} commands); load {load_1m():.2f}"
                )
            ping_agent, ping_local = pings(agent.record, args.pings)
        finally:
            stop_workers(workers)
            for proc in (agent, web):
                if proc is not None:
                    proc.stop()

    local_p50, agent_p50 = percentile(local, 50), percentile(through, 50)
    print(
        "detail: "
        f"commands_per_create_p50={percentile([float(c) for c in per_create], 50):.0f} "
        f"command_kinds={','.join(sorted(kinds)) or '-'} "
        f"command_to_running_p50_ms={percentile(to_running, 50):.2f} "
        f"command_on_agent_p50_ms={percentile(on_agent, 50):.2f} "
        f"command_result_back_p50_ms={percentile(back, 50):.2f} "
        f"ping_agent_p50_ms={percentile(ping_agent, 50):.2f} ping_local_p50_ms={percentile(ping_local, 50):.2f} "
        f"local_max_ms={max(local):.1f} agent_max_ms={max(through):.1f} "
        f"n={args.n} load_1m={load_1m():.2f}",
        flush=True,
    )
    figures(
        {
            "local_p50_ms": local_p50,
            "agent_p50_ms": agent_p50,
            "ratio_vs_local": agent_p50 / local_p50,
            "local_p95_ms": percentile(local, 95),
            "agent_p95_ms": percentile(through, 95),
            "ratio_p95_vs_local": percentile(through, 95) / percentile(local, 95),
        }
    )


if __name__ == "__main__":
    main()
