"""Writes on records: ``apply``, ``delete``, ``transfer``, ``extend``, ``release``, ``protect``,
``unprotect``; the ``stand`` group."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from graphenectl._errors import CliError, UsageError
from graphenectl._options import AllNamespacesOpt, NamespaceOpt, OutputOpt
from graphenectl._output import Format, emit, info, note
from graphenectl._resources import HOLDING_COLUMNS, RECORD_COLUMNS, RESOURCES, STAND_COLUMNS, namespace_columns
from graphenectl._session import record_id, session
from graphenectl._time import parse_duration, ttl

SERVER_MAX_WAIT = 300  # the API waits at most this long in one DELETE ?wait=true
RECORD = RESOURCES["record"]


def read_document(source: str, *, option: str) -> Any:
    """YAML or JSON from a file, or from stdin for ``-``."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as exc:
        raise UsageError(f"{option}: cannot read {source}: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"{option}: {source} is not YAML or JSON: {exc}") from None
    except RecursionError:  # the YAML parser recurses once per level
        raise UsageError(f"{option}: {source} nests too deeply to be read") from None


def check_document(document: Any, *, option: str, path: str) -> None:
    """Refuse what the server would (``graphene_sdk.validation``: NUL characters, lone
    surrogates, numbers JSON cannot carry, too deep), by path, before anything is sent."""
    from graphene_sdk import validation  # imported here: only the commands that send documents need it

    problems = validation.json_problems(document, path=path)
    if problems:
        raise UsageError(f"{option}: the document cannot be sent as it is; nothing was changed", fields=problems)


def parse_labels(values: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for value in values:
        for part in value.split(","):
            key, sep, val = part.partition("=")
            if not sep or not key.strip():
                raise UsageError(f"label {part!r} must look like key=value")
            labels[key.strip()] = val
    return labels


def _show(record: dict[str, Any], output: Format) -> None:
    emit(record, output, columns=RECORD_COLUMNS, name_of=RECORD.name_of)


def apply(
    kind: Annotated[str, typer.Argument(help="the record's kind, e.g. file, test.sleep, graphene.stand")],
    name: Annotated[str, typer.Argument(help="its name, unique among its owner's children of that kind")],
    owner: Annotated[
        str | None,
        typer.Option("--owner", help="the owner: a record id, run/<id> or stand/<pipeline> (stands take none)"),
    ] = None,
    spec: Annotated[
        str | None, typer.Option("--spec", "-f", help="the spec as a YAML/JSON file, or - for stdin")
    ] = None,
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="k=v (repeatable)")] = None,
    ttl_opt: Annotated[str | None, typer.Option("--ttl", help="delete it after this long: 30m, 4h, 2d")] = None,
    namespace: NamespaceOpt = None,
    output: OutputOpt = Format.name,
) -> None:
    """Declare a record of KIND named NAME under an owner; Graphene creates the object.

    A record lives in its owner's namespace; a stand root (graphene.stand, no owner) in the
    namespace chosen (-n, GRAPHENE_NAMESPACE, the context's), else in 'default'.

    Says what it did, as kubectl does: created (a new record), configured (its spec or labels
    changed: a new generation, which Graphene converges) or unchanged (declared as it is).

    Examples:

      graphenectl apply file notes --owner stand/hello -f spec.yaml --ttl 4h

      echo '{"create_ms": 200}' | graphenectl apply test.sleep box --owner <id> --spec -
    """
    body: dict[str, Any] = {"kind": kind, "name": name, "labels": parse_labels(label or [])}
    if spec is not None:
        document = read_document(spec, option="--spec")
        if document is None:
            document = {}
        if not isinstance(document, dict):
            raise UsageError(f"--spec: {spec} must hold a mapping (the kind's spec), not {type(document).__name__}")
        check_document(document, option="--spec", path="spec")
        body["spec"] = document
    if owner:
        body["owner"] = record_id(owner, owner=True)
    if ttl_opt:
        body["ttl_seconds"] = parse_duration(ttl_opt, option="--ttl")
    session.choose(namespace=namespace)
    if not owner:
        body["namespace"] = session.create_namespace()
    client = session.client()
    before = _declared(kind, name, body["owner"]) if body.get("owner") else None
    response = client.request("POST", "records/", body=body)
    record = response.body
    verb = "created" if response.status == 201 else _change(before, record)
    generation = f" (generation {record.get('generation')})" if verb == "configured" else ""
    note(f"record/{record['id']} {verb}{generation}: {record['kind']}/{record['name']} is {record['phase']}")
    _show(record, output)


# What a re-declaration may change; the server bumps the generation for spec and labels.
_DECLARED_FIELDS = ("generation", "spec", "labels", "drift_policy", "observe_every")


def _declared(kind: str, name: str, owner: str) -> dict[str, Any] | None:
    """The live record of KIND and NAME under OWNER, if there is one (to tell what apply did)."""
    found, _ = session.client().list("records/", {"owner": owner, "kind": kind, "name_prefix": name}, limit=None)
    same = [r for r in found if r["name"] == name and r["phase"] != "deleted"]
    return same[0] if same else None


def _change(before: dict[str, Any] | None, after: dict[str, Any]) -> str:
    if before is None:  # declared meanwhile by someone else: this apply set it as it is now
        return "configured"
    changed = any(before.get(key) != after.get(key) for key in _DECLARED_FIELDS)
    return "configured" if changed else "unchanged"


def delete(
    ref: Annotated[str, typer.Argument(metavar="ID", help="a record id (or run/<id>, stand/<pipeline>)")],
    wait: Annotated[bool, typer.Option("--wait", help="wait until it and its subtree are deleted")] = False,
    timeout: Annotated[str, typer.Option("--timeout", help="how long --wait waits (e.g. 60s, 10m)")] = "60s",
    output: OutputOpt = Format.name,
) -> None:
    """Delete a record and everything it owns, children first.

    Without --wait it returns once deletion is requested. With --wait it exits 0 when the
    record is deleted, or 1 if it is still deleting at the timeout (deletion goes on).
    """
    client = session.client()
    rid = record_id(ref)
    seconds = parse_duration(timeout, option="--timeout")
    deadline = time.monotonic() + seconds
    params: dict[str, Any] = {}
    if wait:
        params = {"wait": True, "timeout": min(seconds, SERVER_MAX_WAIT)}
    response = client.request("DELETE", f"records/{rid}/", params=params, timeout=min(seconds, SERVER_MAX_WAIT) + 30)
    record = response.body
    while wait and record["phase"] != "deleted" and time.monotonic() < deadline:
        time.sleep(0.5)
        record = client.get(f"records/{rid}/")
    blockers = record.get("deletion_blocked_by") or []
    if record["phase"] == "deleted":
        note(f"record/{rid} deleted ({record['kind']}/{record['name']} and its subtree)")
    elif blockers:
        named = ", ".join(f"{b['kind']}/{b['name']} ({b['id']})" for b in blockers)
        message = f"record/{rid}: the deletion stops at protected {named}; the rest is deleted, children first"
        if wait:
            raise CliError(message, hint=f"graphenectl unprotect {blockers[0]['id']}")
        note(f"{message}; `graphenectl unprotect {blockers[0]['id']}` lets it finish")
    elif wait:
        error = f"; last error: {record['last_error']}" if record.get("last_error") else ""
        raise CliError(
            f"record/{rid} is still {record['phase']} after {timeout}{error}; deletion goes on",
            hint=f"graphenectl events {rid} -f",
        )
    else:
        note(f"record/{rid} deletion requested (now {record['phase']}); --wait waits for it")
    _show(record, output)


def transfer(
    ref: Annotated[str, typer.Argument(metavar="ID", help="the record to give away (with its subtree)")],
    to: Annotated[str, typer.Option("--to", help="the new owner: a record id, run/<id> or stand/<pipeline>")],
    from_: Annotated[
        str | None, typer.Option("--from", help="the current owner (refused if it is not the owner)")
    ] = None,
    keep_for: Annotated[str | None, typer.Option("--keep-for", help="a new TTL, e.g. 4h")] = None,
    output: OutputOpt = Format.name,
) -> None:
    """Give a record and its subtree to another owner, optionally with a new TTL.

    Example: graphenectl transfer <id> --to stand/hello --keep-for 4h
    """
    rid = record_id(ref)
    body: dict[str, Any] = {"to": record_id(to, owner=True)}
    if from_:
        body["from"] = record_id(from_)
    if keep_for:
        body["ttl_seconds"] = parse_duration(keep_for, option="--keep-for")
    record = session.client().post(f"records/{rid}/transfer/", body)
    kept = f", ttl {ttl(record.get('expires_at'))}" if record.get("expires_at") else ""
    note(f"record/{rid} now belongs to {record.get('owner')}{kept}")
    _show(record, output)


def extend(
    ref: Annotated[str, typer.Argument(metavar="ID", help="a record with a TTL")],
    by: Annotated[str, typer.Option("--by", help="push the expiry this much further: 30m, 2h, 1d")],
    output: OutputOpt = Format.name,
) -> None:
    """Push a record's expiry further (a stand holding, a TTL'd environment)."""
    rid = record_id(ref)
    record = session.client().post(f"records/{rid}/extend/", {"by_seconds": parse_duration(by, option="--by")})
    note(f"record/{rid} expires in {ttl(record.get('expires_at'))} ({record.get('expires_at')})")
    _show(record, output)


def release(
    ref: Annotated[str, typer.Argument(metavar="ID", help="a record with a TTL")],
    output: OutputOpt = Format.name,
) -> None:
    """Remove a record's TTL: it stays until deleted."""
    rid = record_id(ref)
    record = session.client().post(f"records/{rid}/release/")
    note(f"record/{rid} has no TTL now; it lives until `graphenectl delete {rid}`")
    _show(record, output)


def protect(
    ref: Annotated[str, typer.Argument(metavar="RECORD", help="a record id (not a run's or a stand's root)")],
    output: OutputOpt = Format.name,
) -> None:
    """Protect a record: a deletion that reaches it stops there.

    Deleting it, an owner of it, a TTL running out or its run ending: it and what it owns stay,
    its owners wait in their deletion, and the rest is deleted. `unprotect` lets the deletion
    finish. Refused for a record that is deleted or already being deleted.
    """
    rid = record_id(ref)
    record = session.client().post(f"records/{rid}/protect/")
    note(f"record/{rid} is protected (by {record.get('protected_by')}); `graphenectl unprotect {rid}` removes it")
    _show(record, output)


def unprotect(
    ref: Annotated[str, typer.Argument(metavar="RECORD", help="a protected record")],
    output: OutputOpt = Format.name,
) -> None:
    """Remove a record's protection; a deletion that waited on it goes on, children first."""
    rid = record_id(ref)
    record = session.client().post(f"records/{rid}/unprotect/")
    if record.get("deletion_requested_at") and not record.get("deletion_blocked_by"):
        note(f"record/{rid} is unprotected; its deletion goes on (`graphenectl get record/{rid}` follows it)")
    elif record.get("deletion_blocked_by"):
        others = ", ".join(f"{b['kind']}/{b['name']} ({b['id']})" for b in record["deletion_blocked_by"])
        note(f"record/{rid} is unprotected; its deletion still waits on protected {others}")
    else:
        note(f"record/{rid} is unprotected")
    _show(record, output)


# --- stand -----------------------------------------------------------------------------------

stand_app = typer.Typer(
    name="stand",
    help="Each pipeline's stand: the environments runs handed over, each with its own TTL.",
    no_args_is_help=True,
)


@stand_app.command("list")
def stand_list(
    namespace: NamespaceOpt = None, all_namespaces: AllNamespacesOpt = False, output: OutputOpt = Format.table
) -> None:
    """The stands, with how many holdings and records each has: in the namespace chosen, else
    in every namespace you may see (with a NAMESPACE column)."""
    session.choose(namespace=namespace, all_namespaces=all_namespaces)
    chosen = session.list_namespace()
    stands = session.client().get("stands/", {"namespace": chosen} if chosen is not None else None)
    if not stands and output in (Format.table, Format.wide):
        where = f" in namespace {chosen!r}" if chosen else ""
        info(f"no stands yet{where} (a run creates its pipeline's stand when it hands something over)")
        return
    emit(stands, output, columns=namespace_columns(STAND_COLUMNS, chosen), name_of=RESOURCES["stand"].name_of)


@stand_app.command("show")
def stand_show(pipeline: Annotated[str, typer.Argument(help="the pipeline")], output: OutputOpt = Format.table) -> None:
    """What the pipeline's stand holds, with TTLs and subtree sizes."""
    body = session.client().get(f"stands/{pipeline}/")
    if output in (Format.json, Format.yaml):
        emit(body, output, columns=[], name_of=RECORD.name_of)
    elif not body["holdings"] and output is not Format.name:
        info(f"the stand of {pipeline!r} holds nothing")
    else:
        emit(body["holdings"], output, columns=HOLDING_COLUMNS, name_of=RECORD.name_of)


@stand_app.command("extend")
def stand_extend(
    pipeline: Annotated[str, typer.Argument(help="the pipeline")],
    ref: Annotated[str, typer.Argument(metavar="RECORD", help="a record the stand holds directly")],
    by: Annotated[str, typer.Option("--by", help="push the expiry this much further: 30m, 2h, 1d")],
    output: OutputOpt = Format.name,
) -> None:
    """Extend a holding's TTL (refused unless the stand holds RECORD)."""
    body = {"record": record_id(ref), "by_seconds": parse_duration(by, option="--by")}
    record = session.client().post(f"stands/{pipeline}/extend/", body)
    note(f"record/{record['id']} expires in {ttl(record.get('expires_at'))}")
    _show(record, output)


@stand_app.command("release")
def stand_release(
    pipeline: Annotated[str, typer.Argument(help="the pipeline")],
    ref: Annotated[str, typer.Argument(metavar="RECORD", help="a record the stand holds directly")],
    output: OutputOpt = Format.name,
) -> None:
    """Release a holding from its TTL: it stays on the stand until deleted."""
    record = session.client().post(f"stands/{pipeline}/release/", {"record": record_id(ref)})
    note(f"record/{record['id']} has no TTL now")
    _show(record, output)
