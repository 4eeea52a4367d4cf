"""``graphenectl pipeline``: pipeline code delivered as revisions.

``push`` packs a directory into the canonical archive (``graphene_sdk._delivery.pack``) and
sends it; the server describes it in a fresh process and stores it as an immutable revision
(the same files are the same revision), activating its pipelines unless told not to.
``activate`` points a pipeline at a revision (an older one: a rollback), ``revisions`` lists
them and ``history`` shows a pipeline's activations and rollbacks. ``plan`` shows what a run
would do, without doing it.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from graphene_sdk._retry import retrying

from graphenectl import _plan
from graphenectl._cmd_run import check_inputs, complete_pipeline, draft_definition
from graphenectl._cmd_write import read_document
from graphenectl._errors import EXIT_NOT_FOUND, EXIT_USAGE, CliError, UsageError
from graphenectl._options import AllNamespacesOpt, NamespaceOpt, OutputOpt
from graphenectl._output import Column, Format, emit, info, note, print_unwrapped, to_json, warn, write
from graphenectl._resources import (
    PIPELINE_COLUMNS,
    RESOURCES,
    REVISION_COLUMNS,
    human_size,
    namespace_columns,
    revision_ref,
    short_digest,
)
from graphenectl._session import session
from graphenectl._time import short_time

REVISION = RESOURCES["revision"]
PIPELINE = RESOURCES["pipeline"]

# What graphenectl packs at most. The server's limit (GRAPHENE_REVISION_MAX_BYTES) is not known
# here: it refuses a larger archive itself, saying so. This cap only keeps a wrong DIR (a home
# directory) from being read into memory whole.
PUSH_CAP_BYTES = 512 * 1024**2

pipeline_app = typer.Typer(
    name="pipeline",
    help="Deliver pipeline code: push a directory as a revision, activate or roll back a revision, "
    "list revisions and a pipeline's history; plan what a run would do.",
    no_args_is_help=True,
)

HISTORY_COLUMNS = [
    Column("TIME", lambda e: short_time(e.get("created_at"))),
    Column("REASON", lambda e: e.get("reason")),
    Column("MESSAGE", lambda e: e.get("message")),
    Column("BY", lambda e: e.get("actor") or "-"),
    Column("DIGEST", lambda e: (e.get("data") or {}).get("digest") or "-", wide=True),
]


def _pipeline_or_none(name: str) -> dict[str, Any] | None:
    """The pipeline, or None when no revision of it was ever activated (a draft's only)."""
    try:
        body: dict[str, Any] = session.client().get(f"pipelines/{name}/")
    except CliError as exc:
        if exc.exit_code != EXIT_NOT_FOUND:
            raise
        return None
    return body


def _pack(directory: Path) -> bytes:
    if not directory.exists():
        raise UsageError(f"{directory}: no such directory; nothing was pushed")
    if not directory.is_dir():
        raise UsageError(
            f"{directory} is not a directory; nothing was pushed",
            hint="push the directory that holds the pipeline's modules: graphenectl pipeline push DIR",
        )
    # The SDK's own packing (the server packs again with it: the digest depends on the files
    # alone); imported here, not at start-up.
    from graphene_sdk._delivery import TreeError, pack

    try:
        return pack(directory, max_bytes=PUSH_CAP_BYTES)
    except TreeError as exc:
        raise UsageError(f"{exc}; nothing was pushed") from None
    except OSError as exc:
        raise UsageError(f"cannot read {exc.filename or directory}: {exc.strerror}; nothing was pushed") from None


def _refused(exc: CliError) -> CliError:
    """The server's refusal: its whole reason (an import's traceback) on stderr first, then one
    line with what was wrong, as a failed run ends."""
    first, _, rest = exc.message.partition("\n")
    if rest.strip():
        info(rest.rstrip())
    return CliError(
        f"the revision was refused: {first}",
        exit_code=EXIT_USAGE,
        hint="fix the code and push again; nothing was stored or activated",
    )


@pipeline_app.command("push")
def push(
    directory: Annotated[
        Path,
        typer.Argument(metavar="DIR", help="the directory of pipeline code (its top-level modules and packages)"),
    ],
    no_activate: Annotated[
        bool,
        typer.Option(
            "--no-activate", help="store it only (a draft): try it with `run start --revision`, then activate it"
        ),
    ] = False,
    namespace: NamespaceOpt = None,
    output: OutputOpt = Format.name,
) -> None:
    """Push a directory of pipeline code as a revision, and activate its pipelines (new runs
    start on it; runs started before keep theirs).

    The server imports the code in a fresh process first: code that does not import, defines
    no pipeline or needs modules that are not installed is refused with the reason (an import
    error's traceback), and nothing changes. The same files again are the same revision
    ("unchanged"). Caches, virtual environments and version control directories are left out.

    Examples:

      graphenectl pipeline push ./pipelines -n team-a

      graphenectl pipeline push ./pipelines --no-activate -o json
    """
    data = _pack(directory)  # before the server is asked anything: a wrong DIR is a usage error
    session.choose(namespace=namespace)
    where = session.create_namespace()
    info(f"packed {directory} ({human_size(len(data))}); pushing it to namespace {where!r}")
    client = session.client()
    params = {"namespace": where, "activate": "false" if no_activate else "true"}
    headers = {"Content-Type": "application/gzip", "Content-Length": str(len(data)), "Accept": "application/json"}

    def send() -> tuple[int, dict[str, Any]]:
        # The server imports the code before it answers: more time than a read takes.
        response = client.open_raw(
            "POST", "revisions/", params=params, data=data, headers=headers, timeout=max(session.timeout, 300)
        )
        with response:
            return response.status, json.loads(response.read())

    def retried(attempt: int, wait: float, exc: Exception) -> None:
        info(f"push attempt {attempt} failed ({exc}); trying again in {wait:.1f}s (the same files: one revision)")

    try:
        # Safe to repeat: a revision is its content, and activating the active one changes nothing.
        status, body = retrying(send, retryable=lambda exc: getattr(exc, "retryable", False), on_retry=retried)
    except CliError as exc:
        if exc.code == "revision_refused":
            raise _refused(exc) from None
        raise
    short = short_digest(body["digest"])
    defined = list(body.get("pipelines") or [])
    if status == 201:
        note(f"revision {short} created in namespace {body['namespace']!r} ({human_size(body.get('size'))})")
    else:
        note(f"revision {short} unchanged: namespace {body['namespace']!r} holds these files already")
    note(f"  pipelines: {', '.join(defined) or '-'}")
    activated = list(body.get("activated") or [])
    if no_activate:
        first = defined[0] if defined else "PIPELINE"
        note("  activated: none (--no-activate)")
        info(
            f"try it: graphenectl run start {first} --revision {short} · "
            f"activate it: graphenectl pipeline activate {first} {short}"
        )
    else:
        note(f"  activated: {', '.join(activated) or 'none'}")
        already = [name for name in defined if name not in activated]
        if already:
            note(f"  already active: {', '.join(already)}")
    emit(body, output, columns=REVISION_COLUMNS, name_of=REVISION.name_of)


@pipeline_app.command("activate")
def activate(
    name: Annotated[str, typer.Argument(metavar="PIPELINE", help="the pipeline")],
    revision: Annotated[
        str, typer.Argument(metavar="REVISION", help="a revision's digest prefix (7+ digits), id or revision/<digest>")
    ],
    output: OutputOpt = Format.name,
) -> None:
    """Make REVISION the pipeline's active one: new runs start on it; runs started before keep
    theirs. Activating an older revision is a rollback; both are in `pipeline history`.

    Example: graphenectl pipeline activate hello 1a2b3c4d5e6f
    """
    client = session.client()
    ref = revision_ref(revision)
    before = _pipeline_or_none(name)
    old = before.get("revision") if before else None
    target = client.get(f"revisions/{ref}/")
    if before is not None and old == target["digest"]:
        note(f"pipeline {name}: revision {short_digest(old)} is already active; nothing changed")
        emit(before, output, columns=PIPELINE_COLUMNS, name_of=PIPELINE.name_of)
        return
    try:
        after = client.post(f"pipelines/{name}/activate/", {"revision": target["id"]})
    except CliError as exc:
        if exc.code != "already_active":  # activated meanwhile, by someone else
            raise
        note(f"pipeline {name}: revision {short_digest(target['digest'])} is already active; nothing changed")
        emit(client.get(f"pipelines/{name}/"), output, columns=PIPELINE_COLUMNS, name_of=PIPELINE.name_of)
        return
    new = short_digest(after.get("revision"))
    if old:
        rollback = _older(target, old)
        note(f"pipeline {name}: revision {short_digest(old)} → {new}{' (rolled back)' if rollback else ''}")
    else:
        note(f"pipeline {name}: revision {new} (its first active revision)")
    emit(after, output, columns=PIPELINE_COLUMNS, name_of=PIPELINE.name_of)


def _older(target: dict[str, Any], old_digest: str) -> bool:
    """Whether ``target`` is older than the revision it replaced (the server's rule for a
    rollback); False when that one cannot be read."""
    try:
        old = session.client().get(f"revisions/{old_digest}/", {"namespace": target.get("namespace")})
    except CliError:
        return False
    return str(target.get("created_at") or "") < str(old.get("created_at") or "")


@pipeline_app.command("revisions")
def revisions(
    name: Annotated[str | None, typer.Argument(metavar="PIPELINE", help="only revisions that define it")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many (newest first)")] = 100,
    namespace: NamespaceOpt = None,
    all_namespaces: AllNamespacesOpt = False,
    output: OutputOpt = Format.table,
) -> None:
    """Revisions, newest first, in the namespace chosen (else in every namespace you may see);
    with PIPELINE, those that define it, * marking its active one.

    Examples: graphenectl pipeline revisions hello · graphenectl pipeline revisions -A -o wide
    """
    session.choose(namespace=namespace, all_namespaces=all_namespaces)
    chosen = session.list_namespace()
    items, more = session.client().list("revisions/", {"namespace": chosen, "pipeline": name}, limit=limit)
    if more:
        info(f"showing the newest {len(items)} revisions; more exist (--limit N shows more)")
    if not items and output in (Format.table, Format.wide):
        of = f" of pipeline {name!r}" if name else ""
        info(f"no revisions{of} found" + (f" in namespace {chosen!r}" if chosen else ""))
        return
    columns = namespace_columns(REVISION_COLUMNS, chosen)
    if name is not None and output in (Format.table, Format.wide):
        pipeline = _pipeline_or_none(name)
        active = pipeline.get("revision") if pipeline else None
        columns = [Column("ACTIVE", lambda r: "*" if r["digest"] == active else ""), *columns]
    emit(items, output, columns=columns, name_of=REVISION.name_of)


@pipeline_app.command("history")
def history(
    name: Annotated[str, typer.Argument(metavar="PIPELINE", help="the pipeline")],
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="at most this many (oldest first)")] = None,
    output: OutputOpt = Format.table,
) -> None:
    """The pipeline's delivery history, oldest first: each activation and rollback, from which
    revision to which, by whom."""
    events, more = session.client().list(f"pipelines/{name}/events/", limit=limit)
    if more:
        info(f"showing the first {len(events)} events; more exist (--limit N shows more)")
    if not events and output in (Format.table, Format.wide):
        info(f"no activations of {name!r} yet")
        return
    emit(events, output, columns=HISTORY_COLUMNS, name_of=lambda e: f"event/{e['id']}")


class PlanFormat(StrEnum):
    text = "text"
    json = "json"
    mermaid = "mermaid"


# The server imports the code and runs the pipeline's function before it answers (at most
# GRAPHENE_PLAN_TIMEOUT_SECONDS): more time than a read takes.
PLAN_TIMEOUT_SECONDS = 120.0


@pipeline_app.command("plan")
def plan(
    name: Annotated[str, typer.Argument(metavar="PIPELINE", help="the pipeline", autocompletion=complete_pipeline)],
    input_: Annotated[
        list[str] | None,
        typer.Option("--input", "-i", help="NAME=VALUE, coerced by the input's type (repeatable; a.b=v nests)"),
    ] = None,
    inputs_file: Annotated[
        str | None, typer.Option("--inputs", help="a JSON/YAML file of inputs, or - for stdin (--input wins)")
    ] = None,
    revision: Annotated[
        str | None,
        typer.Option(
            "--revision",
            metavar="REF",
            help="plan this revision (an id or at least 7 digits of its digest) instead of the active one",
        ),
    ] = None,
    output: Annotated[
        PlanFormat,
        typer.Option(
            "--output",
            "-o",
            case_sensitive=False,
            help="text (the tree of records, then the calls in order) | json (the API's answer) | "
            "mermaid (a flowchart: ownership and dependencies)",
        ),
    ] = PlanFormat.text,
) -> None:
    """Show what a run of PIPELINE with these inputs would do, without doing it: nothing is
    created, started or written.

    The server runs the pipeline's code in a recording pass: every declaration (kind, name,
    owner, spec with secret names only), wait, step, child run (planned too) and agent call
    (exec, put_file, get_file, run), in order. Where the run would read a value from outside
    (a record's outputs, a step's result, a command's output) the plan shows a placeholder,
    such as <docker.container db: outputs.address>, carried into later calls. The plan is the
    path on which everything succeeds (commands exit 0); code that branches on a placeholder
    stops the plan there (it says where), and code that raises is an error with its traceback.

    Inputs are checked against the pipeline's schema before anything is sent, as for
    `run start`.

    Examples:

      graphenectl pipeline plan environment -i replicas=3

      graphenectl pipeline plan release --inputs inputs.yaml -o json

      graphenectl pipeline plan hello --revision 1a2b3c4d5e6f -o mermaid > plan.mmd
    """
    client = session.client()
    ref = revision_ref(revision) if revision else None
    definition = draft_definition(name, ref) if ref else client.get(f"pipelines/{name}/")
    base = read_document(inputs_file, option="--inputs") if inputs_file else {}
    inputs = check_inputs(definition, {} if base is None else base, input_ or [], nothing="nothing was planned")
    body: dict[str, Any] = {"inputs": inputs}
    if ref:
        body["revision"] = ref
    try:
        answer: dict[str, Any] = client.post(f"pipelines/{name}/plan/", body, timeout=PLAN_TIMEOUT_SECONDS)
    except CliError as exc:
        if exc.code in ("plan_failed", "plan_timeout"):
            first, _, rest = exc.message.partition("\n")
            if rest.strip():
                info(rest.rstrip())  # the pipeline's traceback
            raise CliError(
                f"pipeline {name} cannot be planned: {first}",
                exit_code=EXIT_USAGE,
                hint="fix the code, or plan with inputs it accepts; nothing was created",
            ) from None
        raise
    if output is PlanFormat.json:
        write(to_json(answer))
    elif output is PlanFormat.mermaid:
        write(_plan.mermaid(answer))
    else:
        write(_plan.headline(answer))
        for root in _plan.tree(answer):
            print_unwrapped(root)
        write("calls, in order:")
        for line in _plan.calls(answer) or ["  (none)"]:
            write(line)
    if not answer.get("complete"):
        warn(_plan.stopped_line(answer))


__all__ = ["pipeline_app"]
