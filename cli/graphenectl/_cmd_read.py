"""Reads: ``get``, ``describe``, ``tree``, ``events``, ``logs`` (and the polling they share)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Group
from rich.live import Live
from rich.text import Text
from rich.tree import Tree

from graphenectl import _inputs
from graphenectl._errors import EXIT_FAILURE, EXIT_NOT_FOUND, CliError, UsageError
from graphenectl._options import AllNamespacesOpt, IntervalOpt, NamespaceOpt, OutputOpt, Severity
from graphenectl._output import (
    Column,
    Format,
    TableWriter,
    emit,
    emit_change,
    info,
    out,
    plain_error,
    print_unwrapped,
    status_style,
    to_yaml,
    warn,
    write,
)
from graphenectl._resources import (
    EVENT_COLUMNS,
    HOLDING_COLUMNS,
    JOURNAL_COLUMNS,
    RESOURCES,
    RUN_COLUMNS,
    TRIGGER_EVENT_COLUMNS,
    Resource,
    complete_resource,
    human_size,
    namespace_columns,
    resource,
    revision_origin,
    short_digest,
    split_ref,
    trigger_ref,
)
from graphenectl._runs import TERMINAL, finish, outcome, run_get, run_view, title
from graphenectl._session import get_record, record_id, session, trigger_find
from graphenectl._time import age, between, parse_time, short_time, ttl

DEFAULT_LIMIT = 100
T = TypeVar("T")


# --- polling ---------------------------------------------------------------------------------


def poll_forever(interval: float) -> Iterator[int]:
    """Ticks until Ctrl-C (the caller catches KeyboardInterrupt); no deadline by design."""
    n = 0
    while True:
        yield n
        n += 1
        time.sleep(interval)


class Transient:
    """While watching, an unreachable server is waited out (one warning per outage), not fatal."""

    def __init__(self) -> None:
        self.failing = False

    def failed(self, exc: CliError) -> None:
        if exc.exit_code != EXIT_FAILURE:
            raise exc
        if not self.failing:
            warn(f"{exc.message} (retrying; Ctrl-C to stop)")
        self.failing = True

    def ok(self) -> None:
        if self.failing:
            info("reconnected")
        self.failing = False

    def run(self, fn: Callable[[], T]) -> T | None:
        try:
            value = fn()
        except CliError as exc:
            self.failed(exc)
            return None
        self.ok()
        return value


# --- get -------------------------------------------------------------------------------------


@dataclass
class Listing:
    resource: Resource
    columns: list[Column]
    name_of: Callable[[dict[str, Any]], str]
    fetch: Callable[[], tuple[Any, list[dict[str, Any]]]]  # (what -o json prints, the rows)
    key: str


def _collect(
    path: str, params: dict[str, Any], *, limit: int, keep: Callable[[dict[str, Any]], bool]
) -> tuple[list[dict[str, Any]], bool]:
    """Pages (newest first) until ``limit`` items pass ``keep``; whether more exist."""
    client = session.client()
    page = client.page(path, {**params, "limit": min(max(limit, 1), 1000)})
    items: list[dict[str, Any]] = []
    while True:
        items.extend(i for i in page.items if keep(i))
        if len(items) >= limit:
            return items[:limit], len(items) > limit or page.next_url is not None
        if not page.next_url:
            return items, False
        page = client.page(page.next_url)


def _listing(
    res: Resource,
    ident: str | None,
    *,
    labels: list[str],
    kind: str | None,
    phases: list[str],
    owner: str | None,
    name_prefix: str | None,
    pipeline: str | None,
    statuses: list[str],
    include_deleted: bool,
    limit: int,
    quiet: bool,
    parent: str | None = None,
) -> Listing:
    client = session.client()
    record_filters = bool(kind or phases or owner or name_prefix or include_deleted)
    if record_filters and (res.name != "record" or ident):
        raise UsageError("--kind, --phase, --owner, --name-prefix and --include-deleted filter records")
    if labels and (res.name not in ("record", "agent", "artifact") or ident):
        raise UsageError("-l/--label filters records, agents and artifacts")
    if statuses and (res.name != "run" or ident):
        raise UsageError("--status filters runs")
    if parent and (res.name != "run" or ident):
        raise UsageError("--parent filters runs")
    if pipeline and (res.name not in ("run", "artifact", "revision", "trigger") or ident):
        raise UsageError("--pipeline filters runs, artifacts, revisions and triggers")
    for label in labels:
        for part in label.split(","):
            if part and "=" not in part:
                raise UsageError(f"label selector {part!r} must look like key=value")

    def single() -> tuple[Any, list[dict[str, Any]]]:
        body = client.get(res.item_path(ident or ""))
        return body, [body]

    if ident and res.name == "stand":
        stand_path = res.item_path(ident)

        def holdings() -> tuple[Any, list[dict[str, Any]]]:
            body = client.get(stand_path)
            return body, list(body.get("holdings", []))

        return Listing(res, HOLDING_COLUMNS, RESOURCES["record"].name_of, holdings, "id")
    if ident and res.name == "trigger" and "/" in ident:  # PIPELINE/NAME, as `-o name` prints it
        wanted = ident

        def named_trigger() -> tuple[Any, list[dict[str, Any]]]:
            body = trigger_find(wanted)
            return body, [body]

        return Listing(res, res.columns, res.name_of, named_trigger, res.key)
    if ident:
        kind_res, ident = split_ref(ident, default=res.name)
        if kind_res is not res:
            raise UsageError(f"{kind_res.name}/{ident} is not one of the {res.plural}")
        return Listing(res, res.columns, res.name_of, single, res.key)

    owner_id = record_id(owner) if owner else None
    chosen = session.list_namespace() if res.namespaced else None

    def many() -> tuple[Any, list[dict[str, Any]]]:
        if not res.paginated:  # one answer (kinds; stands, in the namespace chosen)
            body = client.get(f"{res.path}/", {"namespace": chosen} if chosen is not None else None)
            return body, list(body)
        params: dict[str, Any] = {}
        keep: Callable[[dict[str, Any]], bool] = lambda _: True  # noqa: E731 - a default predicate
        if res.name == "record":
            params = {
                "label": labels,
                "kind": kind,
                "phase": ",".join(p.strip() for ph in phases for p in ph.split(",") if p.strip()),
                "owner": owner_id,
                "name_prefix": name_prefix,
            }
            if not phases and not include_deleted:
                # Tombstones stay in the API for history; like kubectl, a listing shows what exists.
                keep = lambda r: r.get("phase") != "deleted"  # noqa: E731
        elif res.name == "run":
            params = {
                "pipeline": pipeline,
                "status": ",".join(s for st in statuses for s in st.split(",") if s),
                "parent": split_ref(parent, default="run")[1] if parent else None,
            }
        elif res.name == "agent":
            params = {"label": labels}
        elif res.name == "artifact":
            params = {"label": labels, "pipeline": pipeline}
        elif res.name in ("revision", "trigger"):
            params = {"pipeline": pipeline}
        if chosen is not None:
            params["namespace"] = chosen
        items, more = _collect(f"{res.path}/", params, limit=limit, keep=keep)
        if more and not quiet:
            which = "first" if res.name in ("pipeline", "trigger") else "newest"  # those come in name order
            info(f"showing the {which} {len(items)} {res.plural}; more exist (--limit N shows more)")
        return items, items

    columns = namespace_columns(res.columns, chosen) if res.namespaced else res.columns
    return Listing(res, columns, res.name_of, many, res.key)


def _watch(listing: Listing, fmt: Format, interval: float) -> None:
    transient = Transient()
    fingerprints: dict[Any, str] = {}
    try:
        if fmt in (Format.table, Format.wide) and out.is_terminal:
            with Live(console=out, auto_refresh=False, transient=False) as live:
                for _ in poll_forever(interval):
                    got = transient.run(listing.fetch)
                    if got is None:
                        continue
                    table = TableWriter(listing.columns, wide=fmt is Format.wide).render(got[1])
                    stamp = Text(f"\nevery {interval:g}s · {time.strftime('%H:%M:%S')} · Ctrl-C to stop", "dim")
                    live.update(Group(table, stamp), refresh=True)
            return
        writer = TableWriter(listing.columns, wide=fmt is Format.wide) if fmt in (Format.table, Format.wide) else None
        for _ in poll_forever(interval):
            got = transient.run(listing.fetch)
            if got is None:
                continue
            for item in got[1]:
                key = item.get(listing.key)
                fingerprint = json.dumps(item, sort_keys=True, default=str)
                if fingerprints.get(key) != fingerprint:
                    fingerprints[key] = fingerprint
                    emit_change(item, fmt, table=writer, name_of=listing.name_of)
    except KeyboardInterrupt:
        return


def get(
    resource_type: Annotated[
        str,
        typer.Argument(
            metavar="TYPE",
            help="records | runs | pipelines | revisions | triggers | stands | agents | kinds | orphans | artifacts",
            autocompletion=complete_resource,
            show_default=False,
        ),
    ],
    ident: Annotated[
        str | None,
        typer.Argument(
            metavar="ID",
            help="one item: a record or run id, a pipeline/stand/kind name, a revision's digest prefix, "
            "a trigger's PIPELINE/NAME",
        ),
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option("--label", "-l", help="records or agents with label k=v (repeatable; all must match)"),
    ] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="records of this kind, e.g. file")] = None,
    phase: Annotated[
        list[str] | None, typer.Option("--phase", help="records in these phases (repeatable or a,b)")
    ] = None,
    owner: Annotated[
        str | None, typer.Option("--owner", help="records owned directly by this one (id, run/<id>, stand/<name>)")
    ] = None,
    name_prefix: Annotated[str | None, typer.Option("--name-prefix", help="records whose name starts so")] = None,
    include_deleted: Annotated[
        bool, typer.Option("--include-deleted", help="also list deleted records (tombstones)")
    ] = False,
    pipeline: Annotated[
        str | None, typer.Option("--pipeline", help="runs (or artifacts, revisions, triggers) of this pipeline")
    ] = None,
    status: Annotated[list[str] | None, typer.Option("--status", help="runs in these statuses (a,b)")] = None,
    parent: Annotated[
        str | None, typer.Option("--parent", help="the child runs of this run (run/<id> or an id)")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many (newest first)")] = DEFAULT_LIMIT,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="keep polling and show changes until Ctrl-C")] = False,
    interval: IntervalOpt = 2.0,
    namespace: NamespaceOpt = None,
    all_namespaces: AllNamespacesOpt = False,
    output: OutputOpt = Format.table,
) -> None:
    """List records, runs, pipelines, revisions, triggers, stands, agents, kinds, orphans or artifacts, or show one.

    Records, runs, pipelines, revisions, triggers, stands, agents and artifacts are listed in the namespace chosen (-n,
    GRAPHENE_NAMESPACE, the context's); with none chosen, or -A, in every namespace you may
    see, with a NAMESPACE column.

    Examples:

      graphenectl get records -l team=ci --phase ready

      graphenectl get records --owner run/<id> -o wide

      graphenectl get runs --pipeline hello --status failed -o json

      graphenectl get stands hello          (what the stand of 'hello' holds)

      graphenectl get artifacts --pipeline build -o wide

      graphenectl get revisions --pipeline hello

      graphenectl get triggers --pipeline hello    (graphenectl trigger list: the same, with --type)

      graphenectl get records -w            (live; Ctrl-C stops)

      graphenectl get runs -n team-a        (graphenectl get runs -A: every namespace)
    """
    session.choose(namespace=namespace, all_namespaces=all_namespaces)
    res = resource(resource_type)
    listing = _listing(
        res,
        ident,
        labels=label or [],
        kind=kind,
        phases=phase or [],
        owner=owner,
        name_prefix=name_prefix,
        pipeline=pipeline,
        statuses=status or [],
        include_deleted=include_deleted,
        limit=limit,
        quiet=watch,
        parent=parent,
    )
    if watch:
        _watch(listing, output, interval)
        return
    data, rows = listing.fetch()
    if output in (Format.table, Format.wide) and not rows:
        chosen = session.list_namespace() if res.namespaced else None
        where = f" in namespace {chosen!r}" if chosen else ""
        info(f"no {res.plural} found{where}" if not ident else "nothing held")
        return
    # JSON and YAML print the API's answer as it came; tables and names print its rows
    # (for `get stands PIPELINE`, the holdings, not the stand's envelope).
    emit(
        data if output in (Format.json, Format.yaml) else rows, output, columns=listing.columns, name_of=listing.name_of
    )


# --- describe --------------------------------------------------------------------------------


def _kv(rows: list[tuple[str, Any]]) -> None:
    width = max(len(k) for k, _ in rows) + 2
    for key, value in rows:
        line = Text(f"{key}:".ljust(width), style="bold")
        line.append_text(value if isinstance(value, Text) else Text("-" if value in (None, "") else str(value)))
        out.print(line)


def _block(title: str, data: Any) -> None:
    if data in (None, {}, [], ""):
        out.print(Text(f"{title}:", style="bold") + Text(" <none>", style="dim"))
        return
    out.print(Text(f"{title}:", style="bold"))
    text = to_yaml(data) if isinstance(data, dict | list) else str(data)
    for line in text.rstrip("\n").splitlines():
        out.print(Text("  " + line))


def _styled(value: str) -> Text:
    return Text(value, style=status_style(value) or "")


def _run_of(record: dict[str, Any]) -> dict[str, Any] | None:
    """The run whose root record this is (a ``graphene.run`` record), if it still exists."""
    if record.get("kind") != "graphene.run":
        return None
    ident = str((record.get("spec") or {}).get("run") or record["id"])
    try:
        return run_get(ident)
    except CliError as exc:
        if exc.exit_code != EXIT_NOT_FOUND:
            raise
        return None


def _protection(record: dict[str, Any]) -> str:
    if not record.get("protected"):
        return "no"
    return f"yes, by {record.get('protected_by') or '?'} since {record.get('protected_at')}"


def _deletion(record: dict[str, Any]) -> str | None:
    """When deletion was requested, and the protected records it waits on, if any."""
    requested = record.get("deletion_requested_at")
    blockers = record.get("deletion_blocked_by") or []
    if not requested or not blockers:
        return requested
    named = ", ".join(f"{b['kind']}/{b['name']} ({b['id']})" for b in blockers)
    return f"{requested}; blocked: waits on protected {named} (graphenectl unprotect {blockers[0]['id']})"


def _describe_record(record: dict[str, Any]) -> None:
    chain = " > ".join(f"{o['kind']}/{o['name']}" for o in record.get("owner_chain", [])) or "-"
    run = _run_of(record)
    children = dict(record.get("children") or {})
    total = children.pop("total", 0)
    by_phase = ", ".join(f"{n} {p}" for p, n in children.items())
    expires = record.get("expires_at")
    _kv(
        [
            ("Name", record["name"]),
            ("Kind", record["kind"]),
            ("ID", record["id"]),
            ("Namespace", record.get("namespace")),
            ("Phase", _styled(record["phase"])),
            *(
                [("Run", Text(f"run/{run['id']} is ") + _styled(run["status"]) + Text(f" (describe run/{run['id']})"))]
                if run
                else []
            ),
            ("Owner", record.get("owner")),
            ("Owner chain", chain),
            ("Children", f"{total} ({by_phase})" if total else "0"),
            ("Labels", ", ".join(f"{k}={v}" for k, v in (record.get("labels") or {}).items()) or "-"),
            ("TTL", f"{ttl(expires)} (expires {expires})" if expires else "none (lives until deleted)"),
            ("Protected", _protection(record)),
            ("Generation", f"{record.get('generation')} (observed {record.get('observed_generation')})"),
            ("Attempts", record.get("attempts")),
            ("Created by run", record.get("created_by_run")),
            ("Created", f"{record.get('created_at')} ({age(record.get('created_at'))} ago)"),
            ("Updated", record.get("updated_at")),
            ("Deletion requested", _deletion(record)),
            ("Deleted", record.get("deleted_at")),
            ("Last error", plain_error(str(record.get("last_error") or ""))),
        ]
    )
    _block("Spec", record.get("spec"))
    _block("Outputs", record.get("outputs"))
    _block("Conditions", record.get("conditions"))
    events, more = session.client().list(f"records/{record['id']}/events/", limit=5000)
    shown = events[-10:]
    out.print(Text(f"Events (last {len(shown)} of {len(events)}{'+' if more else ''}):", style="bold"))
    if shown:
        TableWriter(_EVENT_TABLE, wide=False).write(shown)
    hint = f"graphenectl events {record['id']}"
    info(f"more: {hint} · graphenectl logs {record['id']} · graphenectl tree {record['id']}")


def waiting_on(run: dict[str, Any]) -> str:
    value = run.get("waiting_on")
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "-"
    return str(value or "-")


def _waits(run: dict[str, Any]) -> list[str]:
    """What a run waits on, by name: its records as ``kind/name (phase)``, child runs as
    ``run pipeline #n (status)``, anything else (an agent's command) by id."""
    ids = [str(v) for v in run.get("waiting_on") or []]
    if not ids:
        return []
    client = session.client()
    known: dict[str, str] = {}
    if run.get("record"):
        tree_body = client.get(f"records/{run['record']}/tree/", {"depth": 10})
        known = {n["id"]: f"{n['kind']}/{n['name']} ({n['phase']})" for n in flatten(tree_body)}
    named = []
    for ident in ids:
        if ident not in known:
            try:
                child = run_get(ident)
            except CliError:
                try:
                    other = client.get(f"records/{ident}/")
                    known[ident] = f"{other['kind']}/{other['name']} ({other['phase']})"
                except CliError:
                    known[ident] = ident
            else:
                known[ident] = f"run {title(child)} ({child['status']})"
        named.append(known[ident])
    return named


def _status_line(run: dict[str, Any], waits: list[str]) -> Text:
    """The run's status and, while it is suspended, why: what it waits on, or until when."""
    line = _styled(run["status"])
    if run["status"] in TERMINAL:  # "failed after 2.1s: StepFailed: ..."
        return line + Text(outcome(run).removeprefix(run["status"]))
    why = []
    if waits:
        why.append("waiting on " + ", ".join(waits))
    if run.get("wake_at"):
        why.append(f"sleeping until {run['wake_at']} (in {ttl(run['wake_at'])})")
    return line + Text(f": {'; '.join(why)}") if why else line


def _describe_run(run: dict[str, Any]) -> None:
    run = run_view(run)
    waits = _waits(run)
    _kv(
        [
            ("Pipeline", f"{run['pipeline']} #{run.get('number')}"),
            ("Revision", _revision_line(run.get("revision"))),
            ("ID", run["id"]),
            ("Status", _status_line(run, waits)),
            ("Cause", cause_line(run)),
            ("Record", run.get("record")),
            ("Parent", f"run/{run['parent']} ({run.get('parent_name')})" if run.get("parent") else "-"),
            ("Attempt", run.get("attempt")),
            ("Waiting on", ", ".join(waits) or "-"),
            ("Wakes at", run.get("wake_at")),
            ("Deadline", run.get("deadline_at")),
            ("Created", f"{run.get('created_at')} ({age(run.get('created_at'))} ago)"),
            ("Started", run.get("started_at")),
            ("Finished", run.get("finished_at")),
            ("Duration", between(run.get("started_at"), run.get("finished_at"))),
            ("Error", plain_error(str(run.get("error") or ""))),
        ]
    )
    _block("Inputs", run.get("inputs"))
    _block("Outputs", run.get("outputs"))
    journal = run.get("journal") or []
    suffix = " (truncated)" if run.get("journal_truncated") else ""
    out.print(Text(f"Journal ({len(journal)} entries{suffix}):", style="bold"))
    if journal:
        TableWriter(JOURNAL_COLUMNS, wide=False).write(journal)
    history, more = session.client().list(f"runs/{run['id']}/events/", limit=5000)
    shown = history[-10:]
    out.print(Text(f"Status history (last {len(shown)} of {len(history)}{'+' if more else ''}):", style="bold"))
    if shown:
        TableWriter(_RUN_EVENT_TABLE, wide=False).write(shown)
    children, more_children = session.client().list("runs/", {"parent": run["id"]}, limit=100)
    if children:
        out.print(Text(f"Child runs ({len(children)}{'+' if more_children else ''}):", style="bold"))
        TableWriter(RUN_COLUMNS, wide=False).write(children)
    info(
        f"more: graphenectl tree run/{run['id']} · graphenectl logs run/{run['id']} · graphenectl run watch {run['id']}"
    )


def cause_line(run: dict[str, Any]) -> str:
    """Why the run started, in one line, with the run that caused it where there is one:
    ``run build #12 succeeded (trigger after-build) · run/<id>``."""
    text = str(run.get("cause_text") or "-")
    cause = run.get("cause") or {}
    if cause.get("type") in ("parent", "upstream") and cause.get("run"):
        return f"{text} · run/{cause['run']}"
    return text


def _fields_table(schema: dict[str, Any]) -> None:
    fields = _inputs.fields(schema)
    if not fields:
        out.print(Text("  (no fields)", style="dim"))
        return
    TableWriter(INPUT_COLUMNS, wide=True).write([f.as_dict() for f in fields])


INPUT_COLUMNS = [
    Column("FIELD", lambda f: f["name"]),
    Column("TYPE", lambda f: f["type"]),
    Column("REQUIRED", lambda f: "yes" if f["required"] else "no"),
    Column("DEFAULT", lambda f: "-" if f["required"] else json.dumps(f["default"])),
    Column("CONSTRAINTS", lambda f: f["constraints"] or "-"),
    Column("DESCRIPTION", lambda f: f["description"] or "-"),
]
_RUN_EVENT_TABLE = [
    Column("TIME", lambda e: short_time(e.get("created_at"))),
    Column("FROM", lambda e: e.get("from_status") or "-", styled=True),
    Column("TO", lambda e: e.get("to_status") or "-", styled=True),
    Column("REASON", lambda e: e.get("reason") or "-"),
    Column("BY", lambda e: e.get("actor") or "-"),
    Column("MESSAGE", lambda e: e.get("message") or ""),
]
_EVENT_TABLE = [
    Column("TIME", lambda e: short_time(e.get("created_at"))),
    *[c for c in EVENT_COLUMNS if c.header != "TIME"],
]


def _revision_line(digest: str | None) -> str:
    """A run's or a pipeline's revision: its digest's first 12 digits, or the installed code."""
    return short_digest(digest) if digest else "- (code installed on the workers)"


def _describe_pipeline(p: dict[str, Any]) -> None:
    _kv(
        [
            ("Name", p["name"]),
            ("Namespace", p.get("namespace")),
            ("Revision", _revision_line(p.get("revision"))),
            ("Source", p.get("source")),
            ("Concurrency", p.get("concurrency")),
            ("Timeout", f"{p['timeout_seconds']}s" if p.get("timeout_seconds") else "none"),
            ("Updated", p.get("updated_at")),
        ]
    )
    _block("Description", p.get("description"))
    out.print(Text("Inputs:", style="bold"))
    _fields_table(p.get("input_schema") or {})
    output_fields = ", ".join(f.name for f in _inputs.fields(p.get("output_schema") or {}))
    _kv([("Outputs", output_fields or "-")])
    info(f"start one: graphenectl run start {p['name']} --input NAME=VALUE ... [--watch]")


def _describe_revision(r: dict[str, Any]) -> None:
    _kv(
        [
            ("Digest", r["digest"]),
            ("ID", r["id"]),
            ("Namespace", r.get("namespace")),
            ("From", revision_origin(r)),
            ("Size", human_size(r.get("size"))),
            ("Created by", r.get("created_by")),
            ("Created", f"{r.get('created_at')} ({age(r.get('created_at'))} ago)"),
            ("Modules", ", ".join((r.get("manifest") or {}).get("modules") or []) or "-"),
        ]
    )
    defined = (r.get("manifest") or {}).get("pipelines") or []
    out.print(Text(f"Pipelines ({len(defined)}):", style="bold"))
    if defined:
        TableWriter(_DEFINED_COLUMNS, wide=False).write(defined)
    info(
        f"activate it: graphenectl pipeline activate PIPELINE {short_digest(r['digest'])} · "
        f"try it first: graphenectl run start PIPELINE --revision {short_digest(r['digest'])}"
    )


_DEFINED_COLUMNS = [
    Column("NAME", lambda p: p["name"]),
    Column("SOURCE", lambda p: p.get("source")),
    Column("INPUTS", lambda p: ",".join((p.get("input_schema") or {}).get("properties") or {}) or "-"),
    Column("CONCURRENCY", lambda p: p.get("concurrency")),
    Column("TRIGGERS", lambda p: ", ".join(p.get("triggers") or []) or "-"),
    Column("DESCRIPTION", lambda p: (str(p.get("description") or "").strip().splitlines() or [""])[0]),
]


def _describe_kind(k: dict[str, Any]) -> None:
    _kv(
        [
            ("Name", k["name"]),
            ("Drift check", f"every {k['drift_interval_seconds']}s" if k.get("drift_interval_seconds") else "never"),
        ]
    )
    _block("Description", k.get("description"))
    out.print(Text("Spec:", style="bold"))
    _fields_table(k.get("spec_schema") or {})


def _describe_stand(s: dict[str, Any]) -> None:
    holdings = len(s.get("holdings", []))
    _kv([("Pipeline", s["pipeline"]), ("Namespace", s.get("namespace")), ("ID", s["id"]), ("Holdings", holdings)])
    if s.get("holdings"):
        TableWriter(HOLDING_COLUMNS, wide=True).write(s["holdings"])
    info(f"extend a holding: graphenectl extend <id> --by 4h · its tree: graphenectl tree stand/{s['pipeline']}")


def _describe_agent(a: dict[str, Any]) -> None:
    _kv(
        [
            ("Name", a["name"]),
            ("ID", a["id"]),
            ("Phase", _styled(a["phase"])),
            ("Connected", "yes" if a.get("connected") else "no"),
            ("Connected at", a.get("connected_at")),
            ("Last seen", a.get("last_seen_at")),
            ("Disconnected at", a.get("disconnected_at")),
            ("Version", a.get("version")),
            ("Peer", a.get("peer")),
        ]
    )
    _block("Labels", a.get("labels"))
    _block("Facts", a.get("facts"))
    _block(
        "Capabilities",
        {
            c["name"]: " ".join([c.get("version") or "", *(f"{k}={v}" for k, v in sorted(c["labels"].items()))]).strip()
            or "-"
            for c in a.get("capabilities") or []
        },
    )
    _block("Conditions", a.get("conditions"))
    info(f"its commands' output: graphenectl logs {a['id']} -f")


def trigger_paused(t: dict[str, Any]) -> str:
    if not t.get("paused"):
        return "no"
    return f"yes, by {t.get('paused_by') or 'the system'} since {t.get('paused_at')}: it starts nothing"


def trigger_fires(t: dict[str, Any]) -> str:
    if t.get("type") == "cron":
        if t.get("paused"):
            return "not while paused (from the first instant after it is resumed)"
        return f"{t.get('next_fire_at')} (in {ttl(t.get('next_fire_at'))})" if t.get("next_fire_at") else "-"
    if t.get("type") == "upstream":
        return f"when a run of {(t.get('spec') or {}).get('pipeline')} ends as its 'on' says"
    return f"on each signed POST to {t.get('hook_path')}"


def describe_trigger(t: dict[str, Any]) -> None:
    last_run, fired = t.get("last_run"), t.get("last_fired_at")
    _kv(
        [
            ("Trigger", trigger_ref(t).removeprefix("trigger/")),
            ("Namespace", t.get("namespace")),
            ("Type", t.get("type")),
            ("Summary", t.get("summary")),
            ("Paused", trigger_paused(t)),
            ("Fires", trigger_fires(t)),
            ("Last fired", f"{fired} ({age(fired)} ago)" if fired else "never"),
            ("Last run", f"run/{last_run} (graphenectl describe run/{last_run})" if last_run else "-"),
            ("Hook", f"POST {t['hook_path']}" if t.get("hook_path") else "-"),
            ("ID", t.get("id")),
            ("Created", f"{t.get('created_at')} ({age(t.get('created_at'))} ago)"),
        ]
    )
    _block("Spec", t.get("spec"))
    events, more = session.client().list(f"triggers/{t['id']}/events/", limit=5000)
    shown = events[-10:]
    out.print(Text(f"Events (last {len(shown)} of {len(events)}{'+' if more else ''}):", style="bold"))
    if shown:
        TableWriter(TRIGGER_EVENT_COLUMNS, wide=False).write(shown)
    ref = trigger_ref(t).removeprefix("trigger/")
    verb = "resume" if t.get("paused") else "pause"
    info(f"more: graphenectl trigger events {ref} · graphenectl trigger {verb} {ref}")


_DESCRIBERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "agent": _describe_agent,
    "record": _describe_record,
    "run": _describe_run,
    "pipeline": _describe_pipeline,
    "kind": _describe_kind,
    "stand": _describe_stand,
    "revision": _describe_revision,
    "trigger": describe_trigger,
}


def describe(
    ref: Annotated[str, typer.Argument(metavar="TYPE/ID", help="record/<id>, run/<id>, pipeline/<name>, ...")],
    ident: Annotated[str | None, typer.Argument(metavar="ID", help="when TYPE and ID are separate words")] = None,
    output: OutputOpt = Format.table,
) -> None:
    """Show everything about one record, run, pipeline, revision, trigger, kind, stand or agent.

    Examples: graphenectl describe record/<id> · graphenectl describe run/<id> ·
    graphenectl describe pipeline/hello · graphenectl describe revision/<digest prefix> ·
    graphenectl describe trigger/hello/nightly · graphenectl describe kind/file · graphenectl describe <record-id>
    """
    client = session.client()
    res, key = (resource(ref), ident) if ident else split_ref(ref)
    if res.name not in _DESCRIBERS:
        raise UsageError(
            f"describe takes a record, run, pipeline, revision, trigger, kind, stand or agent, not {res.plural}"
        )
    if res.name == "record" and ident is None and "/" not in ref:
        try:
            body = client.get(res.item_path(key))
        except CliError as exc:  # a bare id may be a run's: people copy run ids from `get runs`
            if exc.exit_code != EXIT_NOT_FOUND:
                raise
            try:
                res, body = RESOURCES["run"], client.get(f"runs/{key}/")
            except CliError:
                raise exc from None
        else:
            # A run's id is its root record's too: a bare one means the run (its status),
            # not the record that roots its tree (always "ready" while the run lives).
            run = _run_of(body)
            if run is not None:
                res, body = RESOURCES["run"], client.get(f"runs/{run['id']}/")
    elif res.name == "trigger" and "/" in key:
        body = trigger_find(key)
    else:
        body = client.get(res.item_path(key))
    if output in (Format.table, Format.wide):
        _DESCRIBERS[res.name](body)
    else:
        emit(body, output, columns=res.columns, name_of=res.name_of)


# --- tree ------------------------------------------------------------------------------------


def _node_label(node: dict[str, Any]) -> Text:
    label = Text()
    label.append(f"{node['kind']}/", style="dim")
    label.append(node["name"], style="bold")
    label.append("  ")
    label.append(node["phase"], style=status_style(node["phase"]) or "")
    if node.get("expires_at"):
        label.append(f"  ttl {ttl(node['expires_at'])}", style="yellow")
    if node.get("protected"):
        label.append("  protected", style="yellow")
    label.append(f"  {node['id']}", style="dim")
    if node.get("truncated"):
        label.append("  … (deeper: --depth)", style="dim")
    return label


def render_tree(root: dict[str, Any]) -> Tree:
    tree = Tree(_node_label(root), guide_style="dim")
    _add_children(tree, root)
    return tree


def _add_children(branch: Tree, node: dict[str, Any]) -> None:
    for child in node.get("children", []):
        _add_children(branch.add(_node_label(child)), child)


def _add_child_runs(tree: Tree, run_root: dict[str, Any], depth: int) -> None:
    """Under a run's tree, its child runs, each with its own record tree (each run roots its own)."""
    client = session.client()
    run_id = str((run_root.get("spec") or {}).get("run") or run_root["id"])
    children, more = client.list("runs/", {"parent": run_id}, limit=100)
    for child in reversed(children):  # oldest first, as they were started
        label = Text("child run ", style="dim") + Text(f"{child['pipeline']}#{child['number']}", style="bold")
        label.append("  ")
        label.append(child["status"], style=status_style(child["status"]) or "")
        label.append(f"  run/{child['id']}", style="dim")
        branch = tree.add(label)
        if child.get("record") and depth > 0:
            sub = client.get(f"records/{child['record']}/tree/", {"depth": depth - 1})
            _add_children(branch, sub)
    if more:
        tree.add(Text(f"… more child runs: graphenectl run list --parent {run_id}", style="dim"))


def flatten(root: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [root]
    for child in root.get("children", []):
        nodes.extend(flatten(child))
    return nodes


def tree(
    owner: Annotated[str, typer.Argument(metavar="OWNER", help="a record id, run/<id> or stand/<pipeline>")],
    depth: Annotated[int, typer.Option("--depth", "-d", min=0, max=10, help="levels below OWNER")] = 3,
    output: OutputOpt = Format.table,
) -> None:
    """Show the subtree OWNER owns, with phases and TTLs (deleting OWNER deletes all of it)."""
    record = get_record(owner)
    body = session.client().get(f"records/{record['id']}/tree/", {"depth": depth})
    if output is Format.name:
        for node in flatten(body):
            write(f"record/{node['id']}")
    elif output in (Format.json, Format.yaml):
        emit(body, output, columns=[], name_of=lambda n: n["id"])
    else:
        rendered = render_tree(body)
        if record.get("kind") == "graphene.run":
            _add_child_runs(rendered, record, depth)
        print_unwrapped(rendered)


# --- events and logs -------------------------------------------------------------------------


def stream(
    path: str,
    params: dict[str, Any],
    *,
    follow: bool,
    interval: float,
    output: Format,
    limit: int | None,
    print_item: Callable[[dict[str, Any]], None],
    name_of: Callable[[dict[str, Any]], str],
    run: str | None = None,
) -> None:
    """Print a stream's items; with ``follow``, keep printing new ones until Ctrl-C, or, for a
    ``run``, until it ends: what was written up to its end is printed, then its final status
    (as ``run watch`` ends: exit 0 if it succeeded, 4 otherwise)."""
    client = session.client()
    if not follow:
        items, more = client.list(path, params, limit=limit)
        if output in (Format.json, Format.yaml, Format.name):
            emit(items, output, columns=[], name_of=name_of)
        else:
            for item in items:
                print_item(item)
        if more:
            info(f"showing the first {len(items)}; more exist (--limit N)")
        return
    transient = Transient()
    cursor = client.cursor(path, params)
    ended: dict[str, Any] | None = None
    try:
        while True:
            got = transient.run(cursor.poll)
            items, more = got if got is not None else ([], False)
            for item in items:
                if output in (Format.json, Format.yaml, Format.name):
                    emit_change(item, output, table=None, name_of=name_of)
                else:
                    print_item(item)
            if more:
                continue
            if ended is not None and got is not None:  # read to the end, after the run ended
                finish(ended)
                return
            if run is not None and got is not None:
                now = transient.run(lambda: run_get(run))
                if now is not None and now["status"] in TERMINAL:
                    ended = now
                    continue  # once more: what was written before it ended
            time.sleep(interval)
    except KeyboardInterrupt:
        return


def _run_followed(ref: str, record: dict[str, Any]) -> str | None:
    """The run whose end ends ``-f`` on ``ref``: ``run/<id>``, a bare run id, or a run's root record."""
    kind, ident = split_ref(ref)
    if kind.name == "run":
        return ident
    if record.get("kind") == "graphene.run":
        return str((record.get("spec") or {}).get("run") or record["id"])
    return None


def events(
    ref: Annotated[str, typer.Argument(metavar="ID", help="a record id, run/<id> or stand/<pipeline>")],
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="keep printing new events until Ctrl-C (for a run: until it ends)"),
    ] = False,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="at most this many (oldest first)")] = None,
    interval: IntervalOpt = 1.0,
    output: OutputOpt = Format.table,
) -> None:
    """The record's history: phase changes, errors, transfers, TTL changes, with the actor.

    Oldest first. With -f, new events are printed as they happen (one JSON object per line with -o json);
    on a run (run/<id>) -f ends when the run ends, with its final status and the exit code of
    `run watch` (0 succeeded, 4 failed, cancelled or timed out).
    """
    record = get_record(ref)
    wide = output is Format.wide
    writer = TableWriter(_EVENT_TABLE, wide=wide)
    stream(
        f"records/{record['id']}/events/",
        {},
        follow=follow,
        interval=interval,
        output=output,
        limit=limit,
        print_item=lambda e: writer.write([e]),
        name_of=lambda e: f"event/{e['id']}",
        run=_run_followed(ref, record) if follow else None,
    )


_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "", "debug": "dim"}


def log_line(item: dict[str, Any], *, wide: bool) -> Text:
    severity = str(item.get("severity", "info"))
    line = Text()
    line.append(short_time(item.get("at")), style="dim")
    line.append(" ")
    line.append(f"{severity.upper():<7}", style=_SEVERITY_STYLE.get(severity, ""))
    line.append(f" [{item.get('record_name') or item.get('record')}]", style="cyan")
    if wide:
        line.append(f" {item.get('source') or '-'}/{item.get('stream')} {item.get('record')}", style="dim")
    line.append(" ")
    line.append(str(item.get("message", "")))
    return line


def logs(
    ref: Annotated[
        str, typer.Argument(metavar="ID", help="a record id or run/<id> (a run's log includes its records')")
    ],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep printing new lines until Ctrl-C (for a run: until it ends)")
    ] = False,
    since: Annotated[str | None, typer.Option("--since", help="from this long ago (10m, 2h) or an ISO time")] = None,
    until: Annotated[str | None, typer.Option("--until", help="up to this long ago or ISO time")] = None,
    grep: Annotated[str | None, typer.Option("--grep", help="only lines containing this text (any case)")] = None,
    severity: Annotated[
        Severity | None, typer.Option("--severity", case_sensitive=False, help="at least this severity")
    ] = None,
    no_descendants: Annotated[
        bool, typer.Option("--no-descendants", help="only the record's own lines, not its subtree's")
    ] = False,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="at most this many (oldest first)")] = None,
    tail: Annotated[
        int | None, typer.Option("--tail", min=1, max=10_000, help="only the last N lines (with -f: then follow)")
    ] = None,
    interval: IntervalOpt = 1.0,
    output: OutputOpt = Format.table,
) -> None:
    """Log lines of a record (and by default of everything it owns), oldest first.

    With -f on a run (run/<id>), it ends when the run ends: the lines written up to its end,
    then its final status, with the exit code of `run watch` (0 succeeded, 4 otherwise).

    Examples: graphenectl logs run/<id> -f --tail 50
              graphenectl logs <id> --since 10m --grep timeout --severity warning
    """
    params: dict[str, Any] = {
        "grep": grep,
        "severity": severity.value if severity else None,
        "since": parse_time(since, option="--since") if since else None,
        "until": parse_time(until, option="--until") if until else None,
        "descendants": "false" if no_descendants else None,
        "tail": tail,
    }
    record = get_record(ref)
    wide = output is Format.wide
    stream(
        f"records/{record['id']}/logs/",
        params,
        follow=follow,
        interval=interval,
        output=output,
        limit=limit,
        print_item=lambda item: out.print(log_line(item, wide=wide)),
        name_of=lambda item: f"logline/{item['id']}",
        run=_run_followed(ref, record) if follow else None,
    )


__all__ = ["describe", "events", "get", "logs", "tree"]
