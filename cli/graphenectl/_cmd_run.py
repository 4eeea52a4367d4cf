"""The run lifecycle: ``run start|inputs|watch|result|cancel|resume|list``."""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from graphene_sdk._retry import IDEMPOTENCY_HEADER, new_idempotency_key, retrying
from rich.console import Group
from rich.live import Live
from rich.text import Text

from graphenectl import _inputs
from graphenectl._client import Cursor
from graphenectl._cmd_read import (
    INPUT_COLUMNS,
    Transient,
    cause_line,
    flatten,
    get,
    log_line,
    render_tree,
    waiting_on,
)
from graphenectl._cmd_write import read_document
from graphenectl._errors import EXIT_INTERRUPTED, CliError, UsageError
from graphenectl._options import AllNamespacesOpt, IntervalOpt, NamespaceOpt, OutputOpt
from graphenectl._output import (
    Format,
    emit,
    err,
    error_summary,
    info,
    note,
    status_style,
    to_json,
    to_yaml,
    warn,
    write,
)
from graphenectl._resources import RESOURCES, RUN_COLUMNS, revision_ref, short_digest, split_ref
from graphenectl._runs import TERMINAL, outcome, run_get, title
from graphenectl._runs import finish as end
from graphenectl._session import session
from graphenectl._time import between, parse_iso

RUN = RESOURCES["run"]

run_app = typer.Typer(
    name="run",
    help="Start, watch, inspect, cancel and resume pipeline runs.",
    no_args_is_help=True,
)


def complete_pipeline(incomplete: str) -> list[str]:
    """Pipeline names from the server, for shell completion; nothing if it cannot be asked quickly."""
    try:
        session.timeout = 2.0
        pipelines, _ = session.client().list("pipelines/", {"namespace": session.list_namespace()}, limit=None)
        return [p["name"] for p in pipelines if p["name"].startswith(incomplete)]
    except Exception:  # completion must never print a traceback into the shell
        return []


def run_id(ref: str) -> str:
    kind, ident = split_ref(ref, default="run")
    if kind is not RUN:
        raise UsageError(f"{ref!r} is not a run; pass a run id or run/<id>")
    return ident


# --- inputs ----------------------------------------------------------------------------------


def _print_fields(pipeline: dict[str, Any], output: Format) -> None:
    schema = pipeline.get("input_schema") or {}
    fields = [f.as_dict() for f in _inputs.fields(schema)]
    if output is Format.json:
        write(to_json(schema))
    elif output is Format.yaml:
        write(to_yaml(schema))
    elif output is Format.name:
        for f in fields:
            write(f["name"])
    elif not fields:
        info(f"pipeline {pipeline['name']!r} takes no inputs")
    else:
        emit(fields, output, columns=INPUT_COLUMNS, name_of=lambda f: f["name"])
        info(f"set them with: graphenectl run start {pipeline['name']} --input NAME=VALUE ...")


def inputs_cmd(
    pipeline: Annotated[str, typer.Argument(help="the pipeline", autocompletion=complete_pipeline)],
    output: OutputOpt = Format.table,
) -> None:
    """List a pipeline's inputs: types, defaults, constraints and descriptions (-o json: its JSON Schema)."""
    _print_fields(session.client().get(f"pipelines/{pipeline}/"), output)


def draft_definition(pipeline: str, ref: str) -> dict[str, Any]:
    """The pipeline as revision ``ref`` defines it (name, namespace, input schema): a draft's
    inputs are checked against its own schema, which may not be the active revision's."""
    found = session.client().get(f"revisions/{ref}/")
    defined = (found.get("manifest") or {}).get("pipelines") or []
    entry = next((p for p in defined if p.get("name") == pipeline), None)
    if entry is None:
        names = ", ".join(p["name"] for p in defined) or "none"
        raise UsageError(
            f"revision {short_digest(found['digest'])} defines no pipeline {pipeline!r}; it defines: {names}",
            hint=f"graphenectl pipeline revisions {pipeline}",
        )
    return dict(entry)


def check_inputs(
    pipeline: dict[str, Any], base: Any, pairs: list[str], *, nothing: str = "nothing was started"
) -> dict[str, Any]:
    """Coerce and validate against the pipeline's schema; every problem at once, nothing sent."""
    schema = pipeline.get("input_schema") or {}
    if not isinstance(base, dict):
        raise UsageError("--inputs must hold a JSON/YAML object of input names to values")
    inputs, errors = _inputs.build(schema, base, pairs)
    for path, messages in _inputs.validate(schema, inputs).items():
        if path not in errors:
            errors[path] = messages
    if errors:
        raise UsageError(
            f"inputs for pipeline {pipeline['name']!r} do not match its schema; {nothing}",
            fields=errors,
            hint=f"graphenectl run inputs {pipeline['name']}",
        )
    return inputs


# --- watching --------------------------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


@dataclass
class RunView:
    """What one poll saw: the run and its record tree."""

    run: dict[str, Any]
    tree: dict[str, Any] | None

    @property
    def records(self) -> list[dict[str, Any]]:
        return flatten(self.tree)[1:] if self.tree else []

    @property
    def ended(self) -> bool:
        return self.run["status"] in TERMINAL

    def names(self) -> dict[str, str]:
        """Record ids (the run's tree) to ``kind/name``."""
        return {node["id"]: f"{node['kind']}/{node['name']}" for node in (flatten(self.tree) if self.tree else [])}

    def named(self, text: str) -> str:
        """``text`` with the ids of the run's records replaced by their ``kind/name``."""
        names = self.names()
        return _UUID.sub(lambda m: names.get(m.group(0), m.group(0)), text)

    def progress(self) -> str:
        records = self.records
        ready = sum(1 for r in records if r["phase"] == "ready")
        line = f"{ready}/{len(records)} ready"
        others: dict[str, int] = {}
        for r in records:
            if r["phase"] != "ready":
                others[r["phase"]] = others.get(r["phase"], 0) + 1
        if others:
            line += " · " + ", ".join(f"{n} {p}" for p, n in sorted(others.items()))
        return line

    def last_call(self) -> str:
        journal = self.run.get("journal") or []
        if not journal:
            return "-"
        entry = journal[-1]
        return f"{self.named(entry['call'])} ({entry['status']})"


def _poll(run_ref: str) -> RunView:
    client = session.client()
    run = run_get(run_ref)
    tree = client.get(f"records/{run['record']}/tree/", {"depth": 10}) if run.get("record") else None
    return RunView(run=run, tree=tree)


def _header(view: RunView) -> Text:
    run = view.run
    line = Text()
    line.append(f"run {title(run)}", style="bold")
    line.append(f"  {run['id']}{_on_revision(run)}  ", style="dim")
    line.append(run["status"], style=status_style(run["status"]) or "")
    line.append(f"  {between(run.get('started_at'), run.get('finished_at'))}")
    if run.get("waiting_on") and not view.ended:
        line.append(f"  waiting on {view.named(waiting_on(run))}", style="dim")
    line.append(f"\ncause: {run.get('cause_text') or '-'} · last call: {view.last_call()}", style="dim")
    return line


def _on_revision(run: dict[str, Any]) -> str:
    """`` revision 1a2b3c4d5e6f`` for a run of a delivered revision; nothing for installed code."""
    return f" revision {short_digest(run['revision'])}" if run.get("revision") else ""


def _live_view(view: RunView) -> Group:
    parts: list[Any] = [_header(view)]
    if view.tree:
        parts.append(render_tree(view.tree))
    if view.ended:  # the last line is how it ended, not how many records were ready
        parts.append(Text(outcome(view.run), style=status_style(view.run["status"]) or "bold"))
    else:
        parts.append(Text(view.progress(), style="bold"))
    return Group(*parts)


class ChangePrinter:
    """Line-by-line progress for a non-terminal stderr (CI logs): only what changed.

    Each poll prints, in this order: the journaled calls that moved (``ctx.log`` calls are
    shown by their text, from the run's log, with every other log line of its records), the
    records whose phase changed (by ``kind/name``), the progress line, and the run's status
    when it changed; a run that ended ends with its status, never with the progress line.
    """

    def __init__(self) -> None:
        self.status = ""
        self.phases: dict[str, str] = {}
        self.calls: dict[int, str] = {}
        self.progress = ""
        self.log: Cursor | None = None
        self.log_record: str | None = None

    def show(self, view: RunView) -> bool:
        """Print what changed; True once shown (the run's log was read too)."""
        run = view.run
        happened: list[tuple[datetime, int, Text]] = []  # calls and log lines, printed in time order
        for entry in run.get("journal") or []:
            if entry["call"] == "log" or self.calls.get(entry["seq"]) == entry["status"]:
                continue
            self.calls[entry["seq"]] = entry["status"]
            line = f"  call {entry['seq']} {view.named(entry['call'])}: {entry['status']}"
            if entry.get("error"):
                line += f": {error_summary(str(entry['error']))}"
            at = parse_iso(entry.get("completed_at") or entry.get("created_at")) or _EPOCH
            happened.append((at, len(happened), Text(line, style="dim")))
        for item in self._log_lines(run):
            happened.append((parse_iso(item.get("at")) or _EPOCH, len(happened), log_line(item, wide=False)))
        for _, _, text in sorted(happened, key=lambda h: (h[0], h[1])):
            err.print(text)
        for node in view.records:
            before = self.phases.get(node["id"])
            if before != node["phase"]:
                arrow = f"{before} → " if before else ""
                err.print(Text(f"  {node['kind']}/{node['name']}: {arrow}{node['phase']}"))
                self.phases[node["id"]] = node["phase"]
        progress = view.progress()
        if view.records and progress != self.progress and not view.ended:
            err.print(Text(f"  {progress}", style="bold"))
            self.progress = progress
        if run["status"] != self.status:
            # The first line says which code runs (the revision), the later ones only what changed.
            which = "" if self.status else _on_revision(run)
            err.print(Text(f"run {title(run)}{which}: {self.status + ' → ' if self.status else ''}{run['status']}"))
            if not self.status:
                err.print(Text(f"  cause: {cause_line(run)}", style="dim"))
            self.status = run["status"]
        return True

    def _log_lines(self, run: dict[str, Any]) -> list[dict[str, Any]]:
        """The log lines of the run's records written since the last poll."""
        record = run.get("record")
        if not record:
            return []
        if record != self.log_record:  # a resumed run may have a new root record
            self.log, self.log_record = session.client().cursor(f"records/{record}/logs/"), record
        assert self.log is not None
        lines: list[dict[str, Any]] = []
        more = True
        while more:
            items, more = self.log.poll()
            lines.extend(items)
        return lines


def watch_run(ident: str, *, interval: float) -> dict[str, Any]:
    """Poll the run and show its tree until it ends; returns the final run."""
    transient = Transient()
    view: RunView | None = None
    try:
        if err.is_terminal:
            with Live(console=err, auto_refresh=False, transient=False) as live:
                while True:
                    got = transient.run(lambda: _poll(ident))
                    if got is not None:
                        view = got
                        live.update(_live_view(view), refresh=True)
                        if view.ended:
                            break
                    time.sleep(interval)
        else:
            printer = ChangePrinter()
            while True:
                got = transient.run(lambda: _poll(ident))
                if got is not None:
                    view = got
                    shown = transient.run(functools.partial(printer.show, got))
                    if view.ended and shown:
                        break
                time.sleep(interval)
    except KeyboardInterrupt:
        raise CliError(
            f"stopped watching; the run goes on (graphenectl run watch {ident})", exit_code=EXIT_INTERRUPTED
        ) from None
    assert view is not None
    return view.run


def finish(run: dict[str, Any], output: Format | None) -> None:
    """Report how the run ended (its final status is the last line); exit 4 unless it succeeded."""
    if output is not None:
        emit(run, output, columns=RUN_COLUMNS, name_of=RUN.name_of)
    end(run)


# --- commands --------------------------------------------------------------------------------


@run_app.command("start")
def start(
    pipeline: Annotated[str, typer.Argument(help="the pipeline to run", autocompletion=complete_pipeline)],
    input_: Annotated[
        list[str] | None,
        typer.Option("--input", "-i", help="NAME=VALUE, coerced by the input's type (repeatable; a.b=v nests)"),
    ] = None,
    inputs_file: Annotated[
        str | None, typer.Option("--inputs", help="a JSON/YAML file of inputs, or - for stdin (--input wins)")
    ] = None,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="watch it until it ends; exit 4 unless it succeeds")
    ] = False,
    help_inputs: Annotated[
        bool, typer.Option("--help-inputs", help="list the pipeline's inputs instead of starting it")
    ] = False,
    interval: IntervalOpt = 1.0,
    output: Annotated[
        Format | None,
        typer.Option("--output", "-o", case_sensitive=False, help="print the run: table|wide|json|yaml|name"),
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            help="a key of yours (a CI build id): starting again with it answers the run it started "
            "instead of starting another (default: a fresh key per command)",
        ),
    ] = None,
    revision: Annotated[
        str | None,
        typer.Option(
            "--revision",
            metavar="REF",
            help="a draft: run this revision of the pipeline (an id or at least 7 digits of its digest) "
            "instead of its active one, which stays active",
        ),
    ] = None,
) -> None:
    """Start a run; inputs are checked against the pipeline's schema before anything is sent.

    A start that meets a connection error, a timeout or a server error (5xx) is retried with
    backoff under the same idempotency key: a run is started once, however many tries it takes.

    Examples:

      graphenectl run start hello --input name=Ada --watch

      graphenectl run start environment -i replicas=3 -i branch=feature/x

      graphenectl run start release --inputs inputs.yaml -o json

      graphenectl run start hello --help-inputs

      graphenectl run start hello --revision 1a2b3c4d5e6f   (a draft: a revision not active)
    """
    client = session.client()
    revision = revision_ref(revision) if revision else None
    definition = draft_definition(pipeline, revision) if revision else client.get(f"pipelines/{pipeline}/")
    if help_inputs:
        _print_fields(definition, output or Format.table)
        return
    chosen, lives_in = session.list_namespace(), definition.get("namespace")
    if chosen and lives_in and chosen != lives_in:
        # A pipeline's code names its namespace; a namespace chosen for commands does not move it.
        warn(f"pipeline {pipeline!r} lives in namespace {lives_in!r} (its code says so); the run starts there")
    base = read_document(inputs_file, option="--inputs") if inputs_file else {}
    inputs = check_inputs(definition, {} if base is None else base, input_ or [])
    key = idempotency_key or new_idempotency_key()

    def retried(attempt: int, wait: float, exc: Exception) -> None:
        info(f"start attempt {attempt} failed ({exc}); trying again in {wait:.1f}s with the same idempotency key")

    body: dict[str, Any] = {"inputs": inputs}
    if revision:
        body["revision"] = revision
    answer = retrying(
        lambda: client.request(
            "POST", f"pipelines/{pipeline}/runs/", body=body, extra_headers={IDEMPOTENCY_HEADER: key}
        ),
        retryable=lambda exc: getattr(exc, "retryable", False),
        on_retry=retried,
    )
    run = answer.body
    if answer.headers.get("idempotent-replayed") == "true":  # header names are kept lowercased
        note(f"this key ({key}) started run {title(run)} before: that run is answered, no other is started")
    pinned = f" on revision {short_digest(run.get('revision'))}" if revision else ""
    note(f"started run {title(run)} ({run['status']}){pinned}: run/{run['id']}")
    if not watch:
        info(f"watch it: graphenectl run watch {run['id']}")
        emit(run, output or Format.name, columns=RUN_COLUMNS, name_of=RUN.name_of)
        return
    finish(watch_run(run["id"], interval=interval), output)


@run_app.command("watch")
def watch(
    ref: Annotated[str, typer.Argument(metavar="RUN", help="a run id or run/<id>")],
    interval: IntervalOpt = 1.0,
    output: Annotated[
        Format | None,
        typer.Option("--output", "-o", case_sensitive=False, help="also print the final run: table|json|yaml|name"),
    ] = None,
) -> None:
    """A live view of the run's record tree and progress (n/m ready) until it ends.

    Exits 0 if the run succeeded, 4 if it failed, was cancelled or timed out. Ctrl-C stops
    watching (exit 130); the run goes on.
    """
    finish(watch_run(run_id(ref), interval=interval), output)


@run_app.command("result")
def result(
    ref: Annotated[str, typer.Argument(metavar="RUN", help="a run id or run/<id>")],
    wait: Annotated[bool, typer.Option("--wait", help="wait for the run to end first")] = False,
    interval: IntervalOpt = 1.0,
    output: Annotated[
        Format, typer.Option("--output", "-o", case_sensitive=False, help="json | yaml | table | name")
    ] = Format.json,
) -> None:
    """Print what a succeeded run returned. Exit 4 if it failed, 1 if it has not ended (see --wait)."""
    ident = run_id(ref)
    run = run_get(ident)
    while wait and run["status"] not in TERMINAL:
        time.sleep(interval)
        run = run_get(ident)
    if run["status"] not in TERMINAL:
        raise CliError(
            f"run {title(run)} has not ended (it is {run['status']})",
            hint=f"graphenectl run result {ident} --wait · graphenectl run watch {ident}",
        )
    if run["status"] != "succeeded":
        finish(run, None)
    outputs = run.get("outputs")
    if output is Format.name:
        write(RUN.name_of(run))
    elif output is Format.yaml:
        write(to_yaml(outputs))
    elif output in (Format.table, Format.wide) and isinstance(outputs, dict):
        for key, value in outputs.items():
            write(f"{key}: {value if isinstance(value, str) else to_json(value, compact=True)}")
    else:
        write(to_json(outputs))


@run_app.command("cancel")
def cancel(
    ref: Annotated[str, typer.Argument(metavar="RUN", help="a run id or run/<id>")],
    output: OutputOpt = Format.name,
) -> None:
    """Cancel a run: it ends now, and everything it owns is deleted, children first."""
    run = session.client().post(f"runs/{run_id(ref)}/cancel/")
    note(f"run {title(run)} is {run['status']}; its records are being deleted")
    emit(run, output, columns=RUN_COLUMNS, name_of=RUN.name_of)


@run_app.command("resume")
def resume(
    ref: Annotated[str, typer.Argument(metavar="RUN", help="a run id or run/<id>")],
    watch: Annotated[bool, typer.Option("--watch", "-w", help="watch it until it ends")] = False,
    interval: IntervalOpt = 1.0,
    output: OutputOpt = Format.name,
) -> None:
    """Run it again by replay: journaled calls return their recorded results; nothing is redone."""
    run = session.client().post(f"runs/{run_id(ref)}/resume/")
    note(f"run {title(run)} resumed ({run['status']})")
    if watch:
        finish(watch_run(run["id"], interval=interval), output)
        return
    emit(run, output, columns=RUN_COLUMNS, name_of=RUN.name_of)


@run_app.command("list")
def list_runs(
    pipeline: Annotated[str | None, typer.Option("--pipeline", "-p", help="runs of this pipeline")] = None,
    status: Annotated[list[str] | None, typer.Option("--status", help="runs in these statuses (a,b)")] = None,
    parent: Annotated[
        str | None, typer.Option("--parent", help="the child runs of this run (run/<id> or an id)")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many (newest first)")] = 100,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="keep polling until Ctrl-C")] = False,
    interval: IntervalOpt = 2.0,
    namespace: NamespaceOpt = None,
    all_namespaces: AllNamespacesOpt = False,
    output: OutputOpt = Format.table,
) -> None:
    """Runs, newest first (the same as `graphenectl get runs`): in the namespace chosen, else
    in every namespace you may see."""
    get(
        "runs",
        None,
        label=None,
        kind=None,
        phase=None,
        owner=None,
        name_prefix=None,
        include_deleted=False,
        pipeline=pipeline,
        status=status,
        parent=parent,
        limit=limit,
        watch=watch,
        interval=interval,
        namespace=namespace,
        all_namespaces=all_namespaces,
        output=output,
    )


run_app.command("inputs")(inputs_cmd)

__all__ = ["run_app"]
