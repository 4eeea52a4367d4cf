"""The crash test (``pytest -m chaos``): runs survive workers killed with SIGKILL at random.

30 runs of ``chaos.env`` (20 ``test.sleep`` records in a tree, waits, checkpointed steps, a
durable timer, a delete, a subtree handed to the stand) execute on real prefork worker
processes while a killer thread SIGKILLs a random worker (its whole process group: the main
process and its pool) at random moments and starts a replacement in the background, so that
the other workers keep going; now and then it kills a single pool process instead. A real
``celery beat`` drives the safety nets (run leases, record operation leases).

Afterwards every run succeeded, the journal of each is exactly the program's calls, each
declared record exists exactly once and went through a legal life (one event per phase
change, ending in one ``deleted``), no record ever had two external objects (a monitor
thread watches the test world the whole time), completed steps never ran again, the
at-most-once step never ran twice, each log line was written once, no record saw an error
(``test.sleep`` never fails by itself), and nothing else the runs owned remains: every record
they did not keep is tombstoned, children before parents. The stand holds exactly the
handed-off subtrees (each run's kept zone with its hosts and disks: ready, one object each,
the zone due to expire in an hour). The test then deletes the stand; afterwards every record
the runs declared has ended in one deletion and the world holds no object of theirs.

With ``-s`` the test prints its progress, the kill count and a summary. ``CHAOS_SEED``
replays a schedule of kills (the seed is printed and is in every failure message).
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.db.models import Count, QuerySet
from django.utils import timezone

from apps.observability.models import LogLine
from apps.pipelines import services
from apps.pipelines.choices import TERMINAL, EntryStatus, RunStatus
from apps.pipelines.models import JournalEntry, Run
from apps.records.choices import EventType, Phase
from apps.records.models import Event, Record
from apps.records.services import record_delete_request
from kinds.testing import objects_of
from tests.conftest import REPO, Worker, process_env, purge_queue
from tests.pipelines import chaos_pipelines  # noqa: F401 - registers chaos.env in this process
from tests.pipelines.chaos_pipelines import (
    DISKS,
    HOSTS,
    KEEP_FOR,
    KEPT,
    KEPT_ZONE,
    RECORDS,
    ZONES,
    executions,
    zone_name,
)

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]

RUNS = 30
WORKERS = 4
CONCURRENCY = 3  # the pool processes mostly wait (creates, steps, deletes sleep): 12 of them
MIN_KILLS = 20
MAX_KILLS = 30  # each replacement's start costs CPU that the runs need: enough is enough
RUNS_DEADLINE = 180.0  # seconds from the first start for every run to end
CLEANUP_DEADLINE = 50.0  # then for everything they owned to be deleted

PIPELINE_MODULES = "tests.pipelines.sample,tests.pipelines.chaos_pipelines"


# --- what the program does ------------------------------------------------------------------


def _names(run_id: str) -> tuple[list[str], list[str], list[str]]:
    zones = [zone_name(z, run_id) for z in range(ZONES)]
    hosts = [f"host-{z}-{h}" for z in range(ZONES) for h in range(HOSTS)]
    disks = [f"disk-{h[5:]}-{d}" for h in hosts for d in range(DISKS)]
    return zones, hosts, disks


def expected_parents(run_id: str) -> dict[str, str | None]:
    """Each name the run declares and its owner's name when declared (None: the run), owners first."""
    zones, hosts, disks = _names(run_id)
    parents: dict[str, str | None] = {"net": None, "dns": None}
    parents |= {z: None for z in zones}
    parents |= {h: zones[int(h.split("-")[1])] for h in hosts}
    parents |= {d: f"host-{d.split('-')[1]}-{d.split('-')[2]}" for d in disks}
    assert len(parents) == RECORDS == 20
    return parents


def expected_kept(run_id: str) -> set[str]:
    """The names the run hands to the stand: the kept zone and everything below it."""
    kept = {zone_name(KEPT_ZONE, run_id)}
    for name, parent in expected_parents(run_id).items():  # owners come first
        if parent in kept:
            kept.add(name)
    assert len(kept) == KEPT == 9
    return kept


def expected_calls(run_id: str, ids: dict[str, str]) -> list[str]:
    """The journal of one run; ``ids`` maps names to record ids (parents appear in calls)."""
    zones, hosts, disks = _names(run_id)
    parents = expected_parents(run_id)

    def declare(name: str) -> str:
        parent = parents[name]
        return f"declare test.sleep/{name}" + (f" under {ids[parent]}" if parent else "")

    calls = [declare(n) for n in ["net", "dns", *zones, *hosts, *disks]]
    calls += ["ready test.sleep/net", "step configure-net", "ready test.sleep/dns", "delete test.sleep/dns"]
    for host in hosts:
        calls += [f"ready test.sleep/{host}", f"step provision-{host}"]
    calls += ["sleep"]
    calls += [f"ready test.sleep/{d}" for d in disks[::DISKS]]
    calls += [f"ready test.sleep/{z}" for z in zones]
    calls += [f"to_stand test.sleep/{zones[KEPT_ZONE]}"]
    calls += ["step audit"]
    return calls


def expected_logs(run_id: str) -> list[str]:
    return ["dns is ready"] + [f"provisioning {h}" for h in _names(run_id)[1]]


# --- processes --------------------------------------------------------------------------------


def _pool_children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


class Fleet:
    """The test's worker processes. Replacements start in the background, several at once."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.lock = threading.Lock()
        self.ready: list[Worker] = []
        self.everyone: list[Worker] = []
        self.errors: list[BaseException] = []
        self.closing = False
        self._starters: list[threading.Thread] = []
        self._names = itertools.count()
        self._database = connection.settings_dict["NAME"]

    def start(self) -> Worker:
        with self.lock:
            if self.closing:
                raise RuntimeError("the fleet is shutting down")
            worker = Worker(f"chaos{next(self._names)}", self.log_dir, CONCURRENCY)
            self.everyone.append(worker)
        # process_env() reads this thread's connection settings: they must name the test database.
        assert connection.settings_dict["NAME"] == self._database, connection.settings_dict["NAME"]
        worker.start()
        with self.lock:
            self.ready.append(worker)
        return worker

    def start_in_background(self) -> None:
        def start() -> None:
            try:
                self.start()
            except BaseException as exc:
                if not self.closing:
                    self.errors.append(exc)

        starter = threading.Thread(target=start, name="chaos-worker-start", daemon=True)
        with self.lock:
            self._starters.append(starter)
        starter.start()

    def stop(self) -> None:
        with self.lock:
            self.closing = True
        for starter in self._starters:  # no worker may start after this
            starter.join(timeout=90)
        alive = [w for w in self.everyone if w.proc is not None and w.proc.poll() is None]
        for worker in alive:
            assert worker.proc is not None
            os.killpg(worker.proc.pid, signal.SIGTERM)
        for worker in alive:
            assert worker.proc is not None
            try:
                worker.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()


@pytest.fixture
def chaos_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker and beat processes copy os.environ: make them load the chaos pipeline too."""
    monkeypatch.setenv("GRAPHENE_PIPELINE_MODULES", PIPELINE_MODULES)


@pytest.fixture
def fleet(chaos_env: None, transactional_db: None, tmp_path: Path) -> Iterator[Fleet]:
    purge_queue()
    fleet = Fleet(tmp_path)
    yield fleet
    fleet.stop()
    purge_queue()


@pytest.fixture
def beat(fleet: Fleet, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``celery beat``: it sends runs_recover (every 5 s) and records_reconcile (15 s)."""
    with (tmp_path / "beat.log").open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "graphene_project", "beat",
                "-s", str(tmp_path / "beat-schedule"), "-l", "INFO",
            ],
            cwd=REPO,
            env=process_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


class Killer(threading.Thread):
    """SIGKILLs a random ready worker at random moments and starts a replacement each time.

    It only kills while another worker is ready, so work always goes on somewhere. One time
    in four it kills a single pool process instead: the worker's main process survives,
    forks another and redelivers the task (``task_reject_on_worker_lost``).
    """

    def __init__(self, fleet: Fleet, rng: random.Random) -> None:
        super().__init__(name="chaos-killer", daemon=True)
        self.fleet = fleet
        self.rng = rng
        self.kills = 0
        self.pool_kills = 0
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.log: list[str] = []
        self.began = time.monotonic()

    def run(self) -> None:
        try:
            while not self.stopping.wait(self.rng.uniform(0.5, 2.5)):
                with self.fleet.lock:
                    ready = list(self.fleet.ready)
                if len(ready) < 2:
                    continue
                victim = self.rng.choice(ready)
                assert victim.proc is not None
                at = time.monotonic() - self.began
                children = _pool_children(victim.proc.pid)
                if children and self.rng.random() < 0.25:
                    child = self.rng.choice(children)
                    try:
                        os.kill(child, signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    self.pool_kills += 1
                    self.log.append(f"{at:6.1f}s killed pool process {child} of {victim.name}")
                    continue
                if self.kills >= MAX_KILLS:
                    continue
                with self.fleet.lock:
                    self.fleet.ready.remove(victim)
                victim.kill()
                self.kills += 1
                self.log.append(f"{at:6.1f}s killed worker {victim.name} (pid {victim.proc.pid})")
                self.fleet.start_in_background()
        except BaseException as exc:
            self.error = exc


class WorldMonitor(threading.Thread):
    """Watches the test kinds' world: a record directory holding two objects is a duplicate."""

    def __init__(self, base: Path) -> None:
        super().__init__(name="chaos-world-monitor", daemon=True)
        self.base = base
        self.stopping = threading.Event()
        self.duplicates: dict[str, set[str]] = {}
        self.scans = 0
        self.error: BaseException | None = None

    def scan(self) -> None:
        try:
            folders = list(os.scandir(self.base))
        except FileNotFoundError:
            return
        for folder in folders:
            try:
                names = [n for n in os.listdir(folder.path) if not n.startswith(".")]
            except (FileNotFoundError, NotADirectoryError):
                continue
            if len(names) > 1:
                self.duplicates.setdefault(folder.name, set()).update(names)
        self.scans += 1

    def run(self) -> None:
        try:
            # An object is only ever removed by its record's delete, so a duplicate would
            # live for seconds: a look every 0.2 s sees it.
            while not self.stopping.wait(0.2):
                self.scan()
        except BaseException as exc:
            self.error = exc


# --- reading the outcome ----------------------------------------------------------------------


def _phases(records: QuerySet[Record]) -> dict[str, int]:
    return dict(Counter(records.values_list("phase", flat=True)))


def _progress(ids: list[Any], tree_ids: list[int], kept: QuerySet[Record]) -> str:
    runs = dict(Counter(Run.objects.filter(pk__in=ids).values_list("status", flat=True)))
    phases = _phases(Record.objects.filter(tree_id__in=tree_ids, kind="test.sleep"))
    queued = redis.Redis.from_url(settings.CELERY_BROKER_URL).llen(settings.CELERY_TASK_DEFAULT_QUEUE)
    return f"runs {runs} records {phases} kept {_phases(kept)} queued_messages={queued}"


def _unfinished_report(ids: list[Any]) -> str:
    lines = []
    for run in Run.objects.filter(pk__in=ids).exclude(status__in=list(TERMINAL)):
        waiting = list(Record.objects.filter(pk__in=run.waiting_on).values_list("name", "phase", "next_attempt_at"))
        last = JournalEntry.objects.filter(run=run).order_by("-seq").first()
        lines.append(
            f"  {run} {run.status} attempt={run.attempt} lease_expires_at={run.lease_expires_at} "
            f"updated_at={run.updated_at} wake_at={run.wake_at} waiting_on={waiting} last_call={last}"
        )
    return "\n".join(lines)


def _report(records: QuerySet[Record]) -> str:
    """The records (at most 60), tree by tree, with what they are waiting for."""
    return "\n".join(
        f"  tree {r.tree_id} {r.kind}/{r.name} {r.phase} attempts={r.attempts} requested={r.deletion_requested_at} "
        f"next_attempt_at={r.next_attempt_at} error={r.last_error!r}"
        for r in records.order_by("tree_id", "lft")[:60]
    )


def _wait(
    condition: Callable[[], bool],
    deadline: float,
    what: str,
    report: Callable[[], str],
    progress: Callable[[], str] | None = None,
) -> None:
    began = last = time.monotonic()
    while not condition():
        now = time.monotonic()
        if now > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{report()}")
        if progress is not None and now - last >= 10:
            print(f"  {now - began:5.0f}s {progress()}", flush=True)
            last = now
        time.sleep(0.25)


def _world_objects(base: Path) -> dict[str, list[str]]:
    found = {}
    if base.is_dir():
        for folder in base.iterdir():
            names = [n.name for n in folder.iterdir() if not n.name.startswith(".")] if folder.is_dir() else []
            if names:
                found[folder.name] = names
    return found


def _life_problems(records: dict[Any, Record]) -> list[str]:
    """Each record's phase changes, in order, chain from pending and end in one ``deleted``."""
    problems = []
    lives: defaultdict[Any, list[tuple[str, str, str]]] = defaultdict(list)
    changes = Event.objects.filter(record_id__in=list(records), type=EventType.PHASE_CHANGED).order_by("id")
    for record_id, data, reason, at in changes.values_list("record_id", "data", "reason", "created_at"):
        lives[record_id].append((data.get("from"), data.get("to"), f"{reason} at {at:%H:%M:%S.%f}"))
    for record_id, record in records.items():
        life = lives[record_id]
        story = ", ".join(f"{a}->{b} ({why})" for a, b, why in life)
        phase: str = Phase.PENDING if record.kind == "test.sleep" else Phase.READY
        for before, after, _ in life:
            if before != phase:
                problems.append(f"{record} ({record_id}) went {before}->{after} while it was {phase}: {story}")
                break
            phase = after
        else:
            if [to for _, to, _ in life].count(Phase.DELETED) != 1 or phase != Phase.DELETED:
                problems.append(f"{record} ({record_id}): its life does not end in one deletion: {story}")
    return problems


# --- the test ---------------------------------------------------------------------------------


def test_runs_survive_workers_killed_at_random(fleet: Fleet, beat: subprocess.Popen[bytes]) -> None:
    seed = int(os.environ.get("CHAOS_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    tag = f"seed={seed}"
    world = Path(settings.GRAPHENE_TEST_WORLD_DIR) / "test.sleep"
    before = _world_objects(world)  # other tests of the session are none of our business

    for _ in range(WORKERS):
        fleet.start()
    began = time.monotonic()
    killer = Killer(fleet, rng)
    monitor = WorldMonitor(world)
    monitor.start()
    killer.start()
    try:
        runs = []
        for _ in range(RUNS):  # spread over a few seconds: some starts land during kills
            runs.append(services.run_start(pipeline_name="chaos.env", inputs={}))
            time.sleep(rng.uniform(0.0, 0.3))
        ids = [r.pk for r in runs]
        roots = [r.record_id for r in runs]
        # What the runs still own is their roots' trees; what they hand over moves to the stand's.
        tree_ids = list(Record.objects.filter(pk__in=roots).values_list("tree_id", flat=True))
        kept_records = Record.objects.filter(created_by_run_id__in=roots).exclude(tree_id__in=tree_ids)

        def runs_ended() -> bool:
            assert killer.error is None, f"the killer failed: {killer.error!r}"
            assert not fleet.errors, f"a replacement worker did not start: {fleet.errors!r}"
            return not Run.objects.filter(pk__in=ids).exclude(status__in=list(TERMINAL)).exists()

        _wait(
            runs_ended,
            began + RUNS_DEADLINE,
            f"all runs to end ({tag})",
            lambda: f"kills={killer.kills}\n{_unfinished_report(ids)}",
            lambda: f"kills={killer.kills} {_progress(ids, tree_ids, kept_records)}",
        )
        ended = time.monotonic() - began
        # Keep killing during the clean-up until the quota is met.
        _wait(
            lambda: killer.kills >= MIN_KILLS or killer.error is not None,
            began + RUNS_DEADLINE + 30,
            f"{MIN_KILLS} kills ({tag})",
            lambda: f"only {killer.kills} kills",
        )
    finally:
        killer.stopping.set()
        killer.join(timeout=30)
        if sys.exc_info()[0] is not None:
            monitor.stopping.set()
    assert killer.error is None, f"the killer failed: {killer.error!r}"
    kills = f"kills={killer.kills} pool_process_kills={killer.pool_kills} {tag}"
    print(f"\n{kills} runs_ended_after={ended:.1f}s", flush=True)

    def all_deleted() -> bool:
        return not Record.objects.filter(tree_id__in=tree_ids).exclude(phase=Phase.DELETED).exists()

    def kept_ready() -> bool:
        # A kept disk nobody waited for may still be creating (or be retried after a kill).
        return not kept_records.exclude(phase=Phase.READY).exists()

    try:
        deadline = time.monotonic() + CLEANUP_DEADLINE
        _wait(
            all_deleted,
            deadline,
            f"the runs' trees to be deleted ({kills})",
            lambda: _report(Record.objects.filter(tree_id__in=tree_ids).exclude(phase=Phase.DELETED)),
            lambda: _progress(ids, tree_ids, kept_records),
        )
        _wait(
            kept_ready,
            deadline,
            f"the records kept on the stand to be ready ({kills})",
            lambda: _report(kept_records.exclude(phase=Phase.READY)),
            lambda: _progress(ids, tree_ids, kept_records),
        )
    finally:
        monitor.stopping.set()
        monitor.join(timeout=10)
    monitor.scan()  # one last look, after everything settled
    elapsed = time.monotonic() - began

    # 1. Every run finished, and succeeded.
    runs = list(Run.objects.filter(pk__in=ids).order_by("number"))
    failed = [f"{r} {r.status} (attempt {r.attempt}):\n{r.error}" for r in runs if r.status != RunStatus.SUCCEEDED]
    assert not failed, f"{len(failed)} of {RUNS} runs did not succeed ({kills}):\n" + "\n\n".join(failed)

    stands = list(
        Record.objects.filter(kind="graphene.stand", name="chaos.env", parent__isnull=True).exclude(phase=Phase.DELETED)
    )
    assert len(stands) == 1, f"{len(stands)} live stands of chaos.env ({kills})"
    stand = stands[0]
    checked_at = timezone.now()

    problems: list[str] = []
    reexecuted: Counter[str] = Counter()
    audits: Counter[str] = Counter()
    everything: dict[Any, Record] = {}
    kept_ids: set[Any] = set()
    kept_zones: set[Any] = set()
    for run in runs:
        assert run.record_id is not None
        run_id = str(run.pk)
        parents = expected_parents(run_id)
        kept_names = expected_kept(run_id)
        kept_zone = zone_name(KEPT_ZONE, run_id)
        root = Record.objects.get(pk=run.record_id)
        tree = list(Record.objects.filter(tree_id=root.tree_id))  # what the run still owns
        declared = list(Record.objects.filter(created_by_run_id=run.record_id))  # wherever it is now
        everything |= {r.pk: r for r in [root, *declared]}
        by_name = {r.name: r for r in declared}
        # 2. Each declared record exists exactly once, where the program put it: the kept ones on
        #    the stand, the rest in the run's tree.
        if len(declared) != RECORDS or set(by_name) != set(parents) or {r.kind for r in declared} != {"test.sleep"}:
            names = sorted(Counter(f"{r.kind}/{r.name}" for r in declared).items())
            problems.append(f"{run}: {len(declared)} records declared by the run: {names}")
            continue
        kept = [r for r in declared if r.name in kept_names]
        gone = [r for r in declared if r.name not in kept_names]
        if {r.pk for r in tree} != {root.pk} | {r.pk for r in gone}:
            held = sorted(f"{r.kind}/{r.name}" for r in tree if r.pk != root.pk)
            problems.append(f"{run}: its tree holds {held}, not the {RECORDS - KEPT} records it did not keep")
        astray = [r.name for r in kept if r.tree_id != stand.tree_id]
        if astray:
            problems.append(f"{run}: kept records outside the stand's tree: {astray}")
        owners: dict[Any, Record] = {root.pk: root, stand.pk: stand} | {r.pk: r for r in declared}
        for name, parent in parents.items():
            owner = owners.get(by_name[name].parent_id)  # .get(None): no owner
            want = stand if name == kept_zone else root if parent is None else by_name[parent]
            if owner is None or owner.pk != want.pk:
                problems.append(f"{run}: {name} is owned by {owner}, not {want}")
        declared_twice = list(
            Event.objects.filter(record__in=declared, type=EventType.DECLARED)
            .values_list("record__name")
            .order_by()
            .annotate(n=Count("id"))
            .filter(n__gt=1)
        )
        if declared_twice:
            problems.append(f"{run}: declared more than once: {declared_twice}")

        # 3. The journal is exactly the program's calls, and points at these records.
        ids_by_name = {n: str(r.pk) for n, r in by_name.items()}
        journal = list(JournalEntry.objects.filter(run=run).order_by("seq"))
        calls = [e.call for e in journal if e.call != "log"]  # whether or not logs are journaled
        if calls != expected_calls(run_id, ids_by_name):
            problems.append(f"{run}: journal differs from the program:\n    {calls}")
        if [e.seq for e in journal] != list(range(1, len(journal) + 1)):
            problems.append(f"{run}: journal sequence has gaps: {[e.seq for e in journal]}")
        journaled_ids = {(e.result or {}).get("record_id") for e in journal if e.call.startswith("declare")}
        if journaled_ids != set(ids_by_name.values()):
            problems.append(f"{run}: the journal's declarations are not the records it declared")
        entries = {e.call: e for e in journal}
        handover = entries.get(f"to_stand test.sleep/{kept_zone}")
        handed = (handover.result if handover is not None else None) or {}
        if (handed.get("record_id"), handed.get("stand")) != (ids_by_name[kept_zone], str(stand.pk)):
            problems.append(f"{run}: the journal does not say {kept_zone} went to the stand {stand.pk}: {handed}")

        # 4. What the run saw is the one object each record had.
        outputs = run.outputs or {}
        for name, obj in outputs.get("objects", {}).items():
            if by_name[name].outputs.get("object") != obj:
                problems.append(f"{run}: {name} was ready with object {obj}, record says {by_name[name].outputs}")

        # 5. Steps: a completed step never runs again; the at-most-once step at most once.
        for step in ["configure-net"] + [f"provision-{h}" for h in _names(run_id)[1]]:
            runs_of = executions(run_id, step)
            entry = entries.get(f"step {step}")
            if not runs_of:
                problems.append(f"{run}: step {step} completed without executing")
            elif entry is not None and entry.completed_at is not None:
                late = [t for t, _ in runs_of if t > entry.completed_at.timestamp()]
                if late:
                    problems.append(f"{run}: step {step} ran again after it was journaled completed: {runs_of}")
            reexecuted[step] += max(len(runs_of) - 1, 0)
        audit = executions(run_id, "audit")
        entry = entries.get("step audit")
        audits[f"{entry.status if entry else None}/{outputs.get('audit')}/{len(audit)}x"] += 1
        if len(audit) > 1:
            problems.append(f"{run}: the at-most-once step ran {len(audit)} times: {audit}")
        if entry is not None and entry.status == EntryStatus.COMPLETED and len(audit) != 1:
            problems.append(f"{run}: the at-most-once step completed but executed {len(audit)} times")
        if entry is not None and entry.status == EntryStatus.UNKNOWN and outputs.get("audit") != "unknown":
            problems.append(f"{run}: audit outcome unknown, but the program saw {outputs.get('audit')!r}")

        # 6. Log lines are written once each, like every other call: replay does not repeat them.
        logged = list(LogLine.objects.filter(record_id=run.record_id, source="run").values_list("message", "at"))
        counts = Counter(message for message, _ in logged)
        if counts != Counter(expected_logs(run_id)):
            times = {m: [f"{at:%H:%M:%S.%f}" for mm, at in logged if mm == m] for m, n in counts.items() if n != 1}
            marks = [
                f"#{e.seq} {e.call} at {e.created_at:%H:%M:%S.%f}"
                for e in journal
                if "dns" in e.call or "provision" in e.call
            ]
            problems.append(
                f"{run}: log lines {dict(counts)} instead of one each of {expected_logs(run_id)}; repeated ones at "
                f"{times} (attempts {run.attempt}; journal: {marks})"
            )

        # 7. Nothing else it owned remains: every record it did not keep tombstoned, children
        #    before parents.
        for record in [root, *gone]:
            if record.phase != Phase.DELETED:
                problems.append(f"{run}: {record} is {record.phase}")
            parent = owners.get(record.parent_id)
            if parent is not None and record.deleted_at and parent.deleted_at and record.deleted_at > parent.deleted_at:
                problems.append(f"{run}: {record} was deleted after its owner {parent}")

        # 8. What it kept lives on the stand: ready, one object each, the zone due in an hour.
        for record in kept:
            if record.phase != Phase.READY or record.deletion_requested_at is not None:
                problems.append(
                    f"{run}: kept {record.name} is {record.phase} (deletion requested {record.deletion_requested_at})"
                )
            found = [p.name for p in objects_of(str(record.pk))]
            if found != [record.outputs.get("object")]:
                problems.append(f"{run}: kept {record.name} has the objects {found}, its record says {record.outputs}")
        zone = by_name[kept_zone]
        left = zone.expires_at - checked_at if zone.expires_at else None
        if left is None or not KEEP_FOR - timedelta(minutes=10) < left <= KEEP_FOR:
            problems.append(
                f"{run}: kept {kept_zone} expires at {zone.expires_at}, {left} from now, not about {KEEP_FOR}"
            )
        kept_ids |= {r.pk for r in kept}
        kept_zones.add(zone.pk)

    # 9. The stand holds exactly the handed-off subtrees: the kept zones, and below them nothing
    #    but what the runs declared there.
    on_stand = list(Record.objects.filter(tree_id=stand.tree_id).exclude(phase=Phase.DELETED))
    holdings = {r.pk for r in on_stand if r.parent_id == stand.pk}
    if holdings != kept_zones or len(kept_zones) != RUNS:
        extra = sorted(r.name for r in on_stand if r.pk in holdings - kept_zones)
        problems.append(f"the stand holds {len(holdings)} subtrees, not the {RUNS} kept zones (others: {extra})")
    if {r.pk for r in on_stand} != kept_ids | {stand.pk} or len(kept_ids) != RUNS * KEPT:
        problems.append(f"the stand's tree holds {len(on_stand) - 1} live records, not the {RUNS * KEPT} kept")
    if Record.objects.filter(kind="test.sleep", tree_id__in=tree_ids).count() != RUNS * (RECORDS - KEPT):
        problems.append(f"the runs' trees do not hold exactly {RECORDS - KEPT} test.sleep records each")

    # 10. Deleting the stand deletes all it holds, children first, objects and all.
    stand_began = time.monotonic()
    record_delete_request(record=stand, reason="ChaosCleanup")
    on_stand_now = Record.objects.filter(tree_id=stand.tree_id)

    def stand_deleted() -> bool:
        if on_stand_now.exclude(phase=Phase.DELETED).exists():
            return False
        return not any(objects_of(str(pk)) for pk in kept_ids)

    try:
        _wait(
            stand_deleted,
            stand_began + CLEANUP_DEADLINE,
            f"the stand's tree to be deleted ({kills})",
            lambda: _report(on_stand_now.exclude(phase=Phase.DELETED)),
            lambda: f"stand {_phases(on_stand_now)}",
        )
    except AssertionError as exc:
        problems.append(str(exc))
    stand_cleanup = time.monotonic() - stand_began
    everything[stand.pk] = stand
    after: dict[Any, Record] = {r.pk: r for r in Record.objects.filter(pk__in=[stand.pk, *kept_ids])}
    for record in after.values():
        if record.phase != Phase.DELETED:
            problems.append(f"{record} (kept) is {record.phase} after the stand was deleted")
        parent = after.get(record.parent_id)
        if parent is not None and record.deleted_at and parent.deleted_at and record.deleted_at > parent.deleted_at:
            problems.append(f"{record} (kept) was deleted after its owner {parent}")

    # 11. Every record's life is legal: no transition from a phase it was not in, one deletion.
    problems += _life_problems(everything)

    # 12. test.sleep never fails by itself: an error event means the machinery raced with itself
    #     (say, a create and a delete of one record at the same time).
    errors = list(
        Event.objects.filter(record_id__in=list(everything), type=EventType.ERROR).values_list(
            "record__name", "reason", "message"
        )
    )
    if errors:
        problems.append(f"{len(errors)} error events: {errors[:20]}")

    # 13. No record ever had two objects, and no object of ours survives anywhere in the world.
    if monitor.duplicates:
        problems.append(f"records with two objects at once: {monitor.duplicates}")
    for record_id in everything:
        if objects_of(str(record_id)):
            problems.append(f"orphaned objects of record {record_id}: {objects_of(str(record_id))}")
    new = {k: v for k, v in _world_objects(world).items() if k not in before}
    if new:
        problems.append(f"objects left in the world: {new}")
    orphans = Event.objects.filter(type__in=[EventType.ORPHAN_DELETED, EventType.ORPHAN_DELETE_FAILED]).count()
    if orphans:
        problems.append(f"the sweeper had to delete {orphans} orphans")
    if monitor.error is not None:
        problems.append(f"the world monitor failed: {monitor.error!r}")

    adopted = Event.objects.filter(
        record_id__in=list(everything), type=EventType.PHASE_CHANGED, data__to=Phase.READY, data__adopted=True
    ).count()
    attempts = Counter(r.attempt for r in runs)
    print(
        f"{kills} runtime={elapsed:.1f}s kept_on_stand={len(kept_ids)} records ({len(kept_zones)} zones) "
        f"stand_cleanup={stand_cleanup:.1f}s adopted_creates={adopted} run_attempts={dict(sorted(attempts.items()))} "
        f"step_reexecutions={sum(reexecuted.values())} audit={dict(audits)} world_scans={monitor.scans}\n"
        + "\n".join(killer.log),
        flush=True,
    )
    assert not problems, f"{len(problems)} problems ({kills}, runtime {elapsed:.0f}s):\n" + "\n".join(problems)
    assert killer.kills >= MIN_KILLS, f"only {kills}"
