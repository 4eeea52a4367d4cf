"""Benchmark: round trip of an agent ``exec`` of ``true``, against SSH to the same host.

Agent: ``apps.agents.services.command_submit`` (what a pipeline's ``ctx.agent(...).exec``
stores) of ``{"argv": ["true"]}`` for a real agent — the shipped zipapp, connected to a real
daphne over a loopback websocket, with the Redis channel layer as in production — until the
command row is finished and the waiter knows: the ``agent.command.changed`` hint that
``command_finish`` publishes on commit (channel layer group ``agents``; received here on a
loop of its own), then one read of the row to check it ``succeeded``. The path: the
transaction storing the row, the hint to the agent's consumer, ``commands_deliver`` (row
``sent``), the websocket, the agent's journal, fork/exec of ``true``, the result, the journal,
``command_accepted`` and ``command_finish`` in the consumer, the hint back.

SSH: paramiko against a real OpenSSH server on loopback (generated ed25519 keys, host key
pinned), ``exec_command("true")`` until its exit status arrives, two ways:

* ``ssh_p50_ms``: connect + key exchange + authentication + exec + close — a new SSH session
  per command, as CI scripts do today (``ssh host cmd``): the fair comparison;
* ``ssh_open_p50_ms``: one more channel on an already open, authenticated connection.

The three are interleaved (agent, new SSH, open SSH, ...) so that load changes hit them alike;
``--warmup`` (20) rounds are discarded, then ``--n`` (200) are measured.

    .venv/bin/python bench/agent_exec.py [--n 200]

Last line: ``p50_ms=<x> p95_ms=<y> ssh_p50_ms=<z> ratio_vs_ssh=<x/z> ssh_open_p50_ms=..``
(goal: ``ratio_vs_ssh`` <= 0.5).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._agents_common import AgentProc, CommandWaiter, Sshd, Web, process_cpu_seconds
from bench._common import figures, load_1m, log
from bench._runs_common import percentile, runs_environment

NAME = "agent_exec"


def agent_once(agent: AgentProc, waiter: CommandWaiter) -> dict[str, float]:
    from apps.agents import services
    from apps.agents.models import AgentCommand

    t0 = time.perf_counter()
    command = services.command_submit(agent=agent.record, kind="exec", payload={"argv": ["true"]})
    t_submitted = time.perf_counter()
    if not waiter.expect(str(command.pk)).wait(30):
        late = AgentCommand.objects.get(pk=command.pk)
        raise TimeoutError(f"command {command.pk} not finished after 30 s: {late.status} {late.error}")
    row = (
        AgentCommand.objects.filter(pk=command.pk)
        .values("status", "sent_at", "started_at", "finished_at", "result")
        .get()
    )
    t_done = time.perf_counter()
    if row["status"] != "succeeded":
        raise RuntimeError(f"command {command.pk} ended {row['status']}")
    created = command.created_at

    def since_created(at: Any) -> float:
        return float((at - created).total_seconds() * 1000) if at is not None else float("nan")

    return {
        "ms": (t_done - t0) * 1000,
        "submit_ms": (t_submitted - t0) * 1000,
        "hint_ms": (waiter.seen_at(str(command.pk)) - t0) * 1000,
        # The row's own timestamps (server clock, from created_at, inside the submit transaction).
        "sent_ms": since_created(row["sent_at"]),
        "running_ms": since_created(row["started_at"]),
        "finished_ms": since_created(row["finished_at"]),
        "agent_ms": float(row["result"].get("duration_s", "nan")) * 1000,  # the agent's run: fork to exit
    }


def ssh_exec(client: Any) -> None:
    channel = client.get_transport().open_session()
    try:
        channel.exec_command("true")
        status = channel.recv_exit_status()
    finally:
        channel.close()
    if status != 0:
        raise RuntimeError(f"ssh true exited {status}")


def ssh_new_once(sshd: Sshd) -> float:
    t0 = time.perf_counter()
    client = sshd.client()
    try:
        ssh_exec(client)
    finally:
        client.close()
    return (time.perf_counter() - t0) * 1000


def ssh_open_once(client: Any) -> float:
    t0 = time.perf_counter()
    ssh_exec(client)
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()

    agent_rows: list[dict[str, float]] = []
    ssh_new: list[float] = []
    ssh_open: list[float] = []
    web = agent = sshd = None
    open_client = None
    with runs_environment(NAME, redis_db=5) as bench:
        try:
            web = Web(bench).start()
            agent = AgentProc.declare_and_start(bench, web, name="exec-bench")
            sshd = Sshd(bench.data_dir / "sshd").start()
            open_client = sshd.client()
            waiter = CommandWaiter()
            log(f"web on {web.url}, agent {agent.record.pk} ready, sshd on port {sshd.port}")
            assert web.proc is not None
            assert agent.proc is not None
            cpu_before = {"web": process_cpu_seconds(web.proc.pid), "agent": process_cpu_seconds(agent.proc.pid)}
            for i in range(args.warmup + args.n):
                if i == args.warmup:
                    cpu_before = {
                        "web": process_cpu_seconds(web.proc.pid),
                        "agent": process_cpu_seconds(agent.proc.pid),
                    }
                a = agent_once(agent, waiter)
                s_new = ssh_new_once(sshd)
                s_open = ssh_open_once(open_client)
                if i >= args.warmup:
                    agent_rows.append(a)
                    ssh_new.append(s_new)
                    ssh_open.append(s_open)
                if i % 50 == 0 or i == args.warmup + args.n - 1:
                    log(
                        f"{i + 1}/{args.warmup + args.n}: agent {a['ms']:.1f} ms (submit {a['submit_ms']:.1f}); "
                        f"ssh new {s_new:.1f} ms, open {s_open:.1f} ms; load {load_1m():.2f}"
                    )
            cpu = {
                "web": process_cpu_seconds(web.proc.pid) - cpu_before["web"],
                "agent": process_cpu_seconds(agent.proc.pid) - cpu_before["agent"],
            }
        finally:
            if open_client is not None:
                open_client.close()
            for proc in (agent, sshd, web):
                if proc is not None:
                    proc.stop()

    def pct(key: str, q: float) -> float:
        return percentile([r[key] for r in agent_rows], q)

    p50, p95 = pct("ms", 50), pct("ms", 95)
    s50 = percentile(ssh_new, 50)
    print(
        "detail: "
        f"submit_p50_ms={pct('submit_ms', 50):.2f} row_sent_p50_ms={pct('sent_ms', 50):.2f} "
        f"row_running_p50_ms={pct('running_ms', 50):.2f} row_finished_p50_ms={pct('finished_ms', 50):.2f} "
        f"agent_run_p50_ms={pct('agent_ms', 50):.2f} hint_p50_ms={pct('hint_ms', 50):.2f} "
        f"max_ms={pct('ms', 100):.2f} ssh_p95_ms={percentile(ssh_new, 95):.2f} "
        f"ssh_open_p95_ms={percentile(ssh_open, 95):.2f} "
        f"web_cpu_ms_per_exec={cpu['web'] * 1000 / args.n:.2f} "
        f"agent_cpu_ms_per_exec={cpu['agent'] * 1000 / args.n:.2f} "
        f"n={args.n} load_1m={load_1m():.2f}",
        flush=True,
    )
    figures(
        {
            "p50_ms": p50,
            "p95_ms": p95,
            "ssh_p50_ms": s50,
            "ratio_vs_ssh": p50 / s50,
            "ssh_open_p50_ms": percentile(ssh_open, 50),
            "ratio_vs_ssh_open": p50 / percentile(ssh_open, 50),
        }
    )


if __name__ == "__main__":
    main()
