"""Benchmark: how soon do triggers start runs?

Pipelines from ``bench/_trigger_pipelines.py`` (loaded by this benchmark only), each one no-op
step, on ``--workers`` (1) prefork workers of ``--concurrency`` (2) processes plus a ``celery
beat`` (the scheduler that runs ``triggers_tick_task`` every ``GRAPHENE_TRIGGERS_TICK_SECONDS``),
all started and stopped here. Production lease lengths and missed-instant/firing-retry delays.

* **manual start** (the baseline): ``run_start`` of ``bench.down`` in this process; latency =
  the run's ``started_at`` (the worker took its lease) - the time just before the call, as
  ``run_latency`` measures a start.
* **upstream**: ``run_start`` of ``bench.up``; its success starts ``bench.down`` through the
  ``upstream`` trigger (``run_finish`` writes a firing, a worker runs the ``inputs`` callable
  and ``run_start``, another task executes the run); latency = the downstream's ``started_at``
  - the upstream's ``finished_at`` (both written by the worker: one clock). Checked: the
  downstream's inputs and cause name the upstream run.

Manual and upstream samples are interleaved (load changes hit both), strictly one at a time:
the next starts once every run of the sample succeeded and its root record is tombstoned.
``--warmup`` rounds (3) are discarded, then ``--n`` (50).

* **cron**: ``bench.cron``'s row is synced (which creates its every-second trigger), beat fires
  it for ``--cron-seconds`` (20) after a 2 s warm-up (the first instant may come before the
  first tick that looks ahead for it); then beat stops and the benchmark waits until the last
  scheduled instant has fired and every run ended. Skew = the run's ``created_at`` - its
  instant (``cause["instant"]``). Checked: each instant in the window started exactly one
  run (``cron_duplicates``, ``cron_missing``).

    .venv/bin/python bench/trigger_latency.py [--n 50] [--cron-seconds 20] [--workers 1] [--concurrency 2]

Last line: ``manual_p50_ms manual_p95_ms upstream_p50_ms upstream_p95_ms
upstream_ratio_vs_start`` (upstream p95 / manual p95; goal <= 2.0) ``cron_skew_p50_ms
cron_skew_p95_ms`` (goal under 1,000) ``cron_skew_max_ms cron_fires cron_missing
cron_duplicates load_1m``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import figures, load_1m, log, stop_workers, wait_until, wait_workers_ready
from bench._runs_common import percentile, runs_environment, start_beat, start_run_workers, stop_group
from bench._trigger_pipelines import CRON, CRON_TRIGGER, DOWNSTREAM, UPSTREAM

NAME = "trigger_latency"
POLL = 0.005
CRON_WARMUP_SECONDS = 2.0
# The tick schedules instants up to 1.5 ticks ahead: once beat stopped, none comes later than this.
CRON_DRAIN_SECONDS = 2.0


def _ms(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds() * 1000


def _wait_ended(run_ids: list[Any], what: str) -> None:
    """Every run succeeded and its root record is tombstoned (so clean-up never queues in front
    of the next measurement); a run that failed is an error, with its reason."""
    from apps.pipelines.models import Run
    from apps.records.models import Record

    def done() -> bool:
        runs = list(Run.objects.filter(pk__in=run_ids).values("pk", "status", "error", "record_id"))
        failed = [r for r in runs if r["status"] not in ("queued", "running", "succeeded")]
        if failed:
            raise RuntimeError(f"{what}: run {failed[0]['pk']} is {failed[0]['status']}: {failed[0]['error'][:500]}")
        if len(runs) < len(run_ids) or any(r["status"] != "succeeded" for r in runs):
            return False
        roots = [str(r["record_id"]) for r in runs]
        return Record.objects.filter(pk__in=roots, phase="deleted").count() == len(roots)

    wait_until(done, timeout=60, interval=POLL, what=what)


def manual_once(key: str) -> dict[str, float]:
    from apps.pipelines.models import Run
    from apps.pipelines.services import run_start

    t0 = time.time()
    run = run_start(pipeline_name=DOWNSTREAM, inputs={"key": key})
    t_returned = time.time()
    _wait_ended([run.pk], f"manual run {run.pk}")
    run = Run.objects.get(pk=run.pk)
    assert run.started_at is not None
    return {
        "ms": (run.started_at.timestamp() - t0) * 1000,
        "call_ms": (t_returned - t0) * 1000,  # the caller's transaction + send
        "queued_ms": _ms(run.started_at, run.created_at),  # created -> lease taken
    }


def upstream_once(key: str, trigger_id: Any) -> dict[str, float]:
    from apps.pipelines.models import Run, TriggerFiring
    from apps.pipelines.services import run_start

    up = run_start(pipeline_name=UPSTREAM, inputs={"key": key})
    firing: dict[str, Any] = {}

    def fired() -> bool:
        row = TriggerFiring.objects.filter(trigger_id=trigger_id, key=str(up.pk)).values().first()
        if row is None or row["status"] == "pending":
            return False
        if row["status"] != "started":
            raise RuntimeError(f"upstream run {up.pk}: the firing ended {row['status']}: {row['error'][:500]}")
        firing.update(row)
        return True

    wait_until(fired, timeout=60, interval=POLL, what=f"upstream run {up.pk} to fire its trigger")
    _wait_ended([up.pk, firing["run_id"]], f"upstream run {up.pk} and its downstream run {firing['run_id']}")
    up = Run.objects.get(pk=up.pk)
    down = Run.objects.get(pk=firing["run_id"])
    if down.inputs != {"key": key} or down.cause.get("run") != str(up.pk) or down.cause.get("type") != "upstream":
        raise RuntimeError(f"downstream run {down.pk}: inputs {down.inputs}, cause {down.cause}: not from {up.pk}")
    assert up.finished_at is not None
    assert down.started_at is not None
    return {
        "ms": _ms(down.started_at, up.finished_at),
        "firing_ms": _ms(firing["created_at"], up.finished_at),  # written in run_finish's transaction
        "created_ms": _ms(down.created_at, firing["created_at"]),  # a task ran the inputs callable + run_start
        "queued_ms": _ms(down.started_at, down.created_at),  # created -> lease taken
    }


def cron_phase(seconds: float) -> dict[str, Any]:
    """Sync ``bench.cron`` (its trigger is created, next instant the coming second), let beat
    fire it; the caller stops beat afterwards. Returns the trigger's id and the window."""
    from apps.pipelines.models import Trigger
    from apps.pipelines.services.definitions import definition_get, pipeline_sync

    row = pipeline_sync(definition_get(CRON))
    trigger = Trigger.objects.get(pipeline=row, name=CRON_TRIGGER)
    log(f"cron trigger {trigger} created, first instant {trigger.next_fire_at}; measuring {seconds:.0f} s")
    # The benchmark only watches here: beat and the worker do the work being measured.
    time.sleep(CRON_WARMUP_SECONDS + seconds)
    return {"trigger_id": trigger.pk, "created_at": trigger.created_at}


def cron_results(trigger_id: Any, created_at: datetime, seconds: float) -> dict[str, Any]:
    """After beat stopped: wait until the last scheduled instant fired and its run ended, then
    the skew of each instant in the window and the instants without exactly one run."""
    from django.utils import timezone

    from apps.pipelines.models import Run, TriggerEvent, TriggerFiring

    def drained() -> bool:
        last = TriggerFiring.objects.filter(trigger_id=trigger_id).order_by("-created_at").values("created_at").first()
        quiet = last is None or timezone.now() - last["created_at"] > timedelta(seconds=CRON_DRAIN_SECONDS)
        return quiet and not TriggerFiring.objects.filter(trigger_id=trigger_id, status="pending").exists()

    wait_until(drained, timeout=60, interval=0.1, what="the cron trigger's last firings")
    run_ids = list(Run.objects.filter(trigger_id=trigger_id).values_list("pk", flat=True))
    _wait_ended(run_ids, "the cron runs")

    start = created_at + timedelta(seconds=CRON_WARMUP_SECONDS)
    end = start + timedelta(seconds=seconds)
    runs = list(Run.objects.filter(trigger_id=trigger_id).values("cause", "created_at", "started_at"))
    per_instant = Counter(r["cause"]["instant"] for r in runs)
    window = [r for r in runs if start <= datetime.fromisoformat(r["cause"]["instant"]) < end]
    expected = {
        (start.replace(microsecond=0) + timedelta(seconds=i)).isoformat()
        for i in range(1, int(seconds) + 1)
        if start.replace(microsecond=0) + timedelta(seconds=i) < end
    }
    fired = {r["cause"]["instant"] for r in window}
    skew = [_ms(r["created_at"], datetime.fromisoformat(r["cause"]["instant"])) for r in window]
    started = [_ms(r["started_at"], datetime.fromisoformat(r["cause"]["instant"])) for r in window if r["started_at"]]
    firings = TriggerFiring.objects.filter(trigger_id=trigger_id, key__in=fired).values_list("key", "created_at")
    firing_skew = [_ms(at, datetime.fromisoformat(key)) for key, at in firings]
    failed = TriggerFiring.objects.filter(trigger_id=trigger_id).exclude(status="started").count()
    missed = TriggerEvent.objects.filter(trigger_id=trigger_id, reason__startswith="Missed").count()
    return {
        "skew": skew,
        "started": started,
        "firing_skew": firing_skew,
        "fires": len(window),
        "missing": len(expected - fired),
        "duplicates": sum(1 for n in per_instant.values() if n > 1),
        "not_started": failed,
        "missed_events": missed,
        "all_runs": len(runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cron-seconds", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=2, help="prefork processes of each worker")
    args = parser.parse_args()

    manual: list[dict[str, float]] = []
    upstream: list[dict[str, float]] = []
    workers = beat = None
    extra = {
        "GRAPHENE_PIPELINE_MODULES": "bench._trigger_pipelines",
        # The production values (the test settings shorten them for their outage tests).
        "GRAPHENE_CRON_MISSED_AFTER_SECONDS": "30",
        "GRAPHENE_FIRING_RETRY_SECONDS": "5",
    }
    with runs_environment(NAME, redis_db=4, extra=extra) as bench:
        from apps.pipelines.models import Trigger
        from apps.pipelines.services.definitions import definition_get, pipeline_sync

        try:
            workers = start_run_workers(bench, count=args.workers, concurrency=args.concurrency)
            beat = start_beat(bench)
            log(f"worker ready in {wait_workers_ready(workers):.1f}s")
            # The downstream's row synced: its upstream trigger exists from now on.
            pipeline_sync(definition_get(DOWNSTREAM))
            trigger_id = Trigger.objects.get(pipeline__name=DOWNSTREAM, type="upstream").pk
            load_before = load_1m()
            total = args.warmup + args.n
            for i in range(total):
                m = manual_once(f"m{i}")
                u = upstream_once(f"u{i}", trigger_id)
                if i >= args.warmup:
                    manual.append(m)
                    upstream.append(u)
                if i % 10 == 0 or i == total - 1:
                    log(
                        f"{i + 1}/{total}: manual {m['ms']:.1f} ms; upstream {u['ms']:.1f} ms "
                        f"(firing {u['firing_ms']:.1f}, run created {u['created_ms']:.1f}, "
                        f"lease taken {u['queued_ms']:.1f}); load {load_1m():.2f}"
                    )
            window = cron_phase(args.cron_seconds)
            if beat.procs[0].poll() is not None:
                raise RuntimeError(f"celery beat exited with {beat.procs[0].returncode}:\n{beat.tail()}")
            stop_group(beat.procs[0])
            beat = None
            cron = cron_results(window["trigger_id"], window["created_at"], args.cron_seconds)
        finally:
            if beat is not None:
                stop_group(beat.procs[0])
            stop_workers(workers)

    def pct(rows: list[dict[str, float]], key: str, q: float) -> float:
        return percentile([r[key] for r in rows], q)

    manual_p95, upstream_p95 = pct(manual, "ms", 95), pct(upstream, "ms", 95)
    print(
        "detail: "
        f"manual_call_p50_ms={pct(manual, 'call_ms', 50):.2f} "
        f"manual_queued_p50_ms={pct(manual, 'queued_ms', 50):.2f} "
        f"upstream_firing_p50_ms={pct(upstream, 'firing_ms', 50):.2f} "
        f"upstream_run_created_p50_ms={pct(upstream, 'created_ms', 50):.2f} "
        f"upstream_run_created_p95_ms={pct(upstream, 'created_ms', 95):.2f} "
        f"upstream_queued_p50_ms={pct(upstream, 'queued_ms', 50):.2f} "
        f"upstream_queued_p95_ms={pct(upstream, 'queued_ms', 95):.2f} "
        f"upstream_max_ms={pct(upstream, 'ms', 100):.2f} "
        f"upstream_ratio_p50={pct(upstream, 'ms', 50) / pct(manual, 'ms', 50):.2f} "
        f"cron_firing_p50_ms={percentile(cron['firing_skew'], 50):.2f} "
        f"cron_firing_p95_ms={percentile(cron['firing_skew'], 95):.2f} "
        f"cron_started_p50_ms={percentile(cron['started'], 50):.2f} "
        f"cron_started_p95_ms={percentile(cron['started'], 95):.2f} "
        f"cron_runs_total={cron['all_runs']} cron_firings_not_started={cron['not_started']} "
        f"cron_missed_events={cron['missed_events']} "
        f"n={args.n} workers={args.workers} concurrency={args.concurrency} load_1m_before={load_before:.2f}",
        flush=True,
    )
    figures(
        {
            "manual_p50_ms": pct(manual, "ms", 50),
            "manual_p95_ms": manual_p95,
            "upstream_p50_ms": pct(upstream, "ms", 50),
            "upstream_p95_ms": upstream_p95,
            "upstream_ratio_vs_start": upstream_p95 / manual_p95,
            "cron_skew_p50_ms": percentile(cron["skew"], 50),
            "cron_skew_p95_ms": percentile(cron["skew"], 95),
            "cron_skew_max_ms": percentile(cron["skew"], 100),
            "cron_fires": cron["fires"],
            "cron_missing": cron["missing"],
            "cron_duplicates": cron["duplicates"],
            "load_1m": load_1m(),
        }
    )


if __name__ == "__main__":
    main()
