"""Observability: ``metrics`` (a record's series, aggregated per step) and ``trace`` (a run's spans)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import typer
from rich.text import Text
from rich.tree import Tree

from graphenectl._errors import UsageError
from graphenectl._options import OutputOpt
from graphenectl._output import Column, Format, TableWriter, emit, error_summary, info, print_unwrapped, write
from graphenectl._resources import split_ref
from graphenectl._session import get_record, session
from graphenectl._time import parse_duration, parse_iso, parse_time, short_time

# --- metrics ---------------------------------------------------------------------------------


def _labels(series: dict[str, Any]) -> str:
    labels = series.get("labels") or {}
    return ",".join(f"{k}={v}" for k, v in labels.items()) or "-"


def _number(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


METRIC_COLUMNS = [
    Column("NAME", lambda p: p["name"]),
    Column("LABELS", lambda p: p["labels"]),
    Column("TIME", lambda p: short_time(p["at"])),
    Column("COUNT", lambda p: p["count"]),
    Column("AVG", lambda p: _number(p["avg"])),
    Column("MIN", lambda p: _number(p["min"])),
    Column("MAX", lambda p: _number(p["max"])),
    Column("LAST", lambda p: _number(p["last"])),
    Column("BUCKET START", lambda p: p["at"], wide=True),
]


def _rows(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"name": series["name"], "labels": _labels(series), **point}
        for series in body.get("series", [])
        for point in series.get("points", [])
    ]


def metrics(
    ref: Annotated[str, typer.Argument(metavar="ID", help="a record id, run/<id> (its record) or stand/<pipeline>")],
    name: Annotated[str | None, typer.Option("--name", "-n", help="one series (default: all of them)")] = None,
    window: Annotated[str, typer.Option("--window", "-w", help="how far back: 90s, 15m, 1h, 7d")] = "1h",
    step: Annotated[
        str | None, typer.Option("--step", help="bucket width: 10s, 60s (default 60s, larger for long windows)")
    ] = None,
    end: Annotated[
        str | None, typer.Option("--end", help="end of the window: a duration ago (10m) or ISO time")
    ] = None,
    output: OutputOpt = Format.table,
) -> None:
    """A record's metric series in a window, aggregated per step (count, avg, min, max, last).

    Runs record `step_duration_seconds` (one series per step name) on their record.

    Examples: graphenectl metrics run/<id> --name step_duration_seconds ·
    graphenectl metrics <record-id> --window 7d --step 1h -o json
    """
    # Checked here first, for a message in graphenectl's words; sent as seconds.
    window_s = parse_duration(window, option="--window")
    step_s = parse_duration(step, option="--step") if step is not None else None
    params = {
        "name": name,
        "window": str(window_s),
        "step": str(step_s) if step_s is not None else None,
        "end": parse_time(end, option="--end") if end else None,
    }
    record = get_record(ref)
    body: dict[str, Any] = session.client().get(f"records/{record['id']}/metrics/", params)
    if output in (Format.json, Format.yaml):
        emit(body, output, columns=[], name_of=lambda _: "")
        return
    rows = _rows(body)
    if output is Format.name:
        for series in body.get("series", []):
            write(f"{series['name']}{{{_labels(series)}}}" if series.get("labels") else series["name"])
        return
    if not rows:
        names = ", ".join(body.get("names") or []) or "none"
        info(f"no points in the last {window} (step {body.get('step_seconds')}s); series of this record: {names}")
        return
    TableWriter(METRIC_COLUMNS, wide=output is Format.wide).write(rows)
    if body.get("truncated"):
        info("more series exist than were returned: narrow with --name")


# --- trace -----------------------------------------------------------------------------------

_STATUS_STYLE = {"ok": "green", "error": "bold red", "unset": ""}


def _duration(ms: Any) -> str:
    if ms is None:
        return "running"
    seconds = float(ms) / 1000
    if seconds < 1:
        return f"{float(ms):.1f}ms"
    if seconds < 120:
        return f"{seconds:.2f}s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s"


def _offset(node: dict[str, Any], origin: datetime | None) -> str:
    start = parse_iso(node.get("started_at"))
    if origin is None or start is None:
        return ""
    return f"+{(start - origin).total_seconds():.2f}s"


def _span_label(node: dict[str, Any], *, wide: bool, origin: datetime | None = None) -> Text:
    attributes = node.get("attributes") or {}
    label = Text()
    label.append(node["name"], style="bold")
    if attributes.get("graphene.kind") and attributes.get("graphene.record.name"):
        label.append(f" {attributes['graphene.kind']}/{attributes['graphene.record.name']}")
    label.append(f"  {_duration(node.get('duration_ms'))}", style="cyan")
    if origin is not None:
        label.append(f"  at {_offset(node, origin)}", style="dim")
    status = str(node.get("status") or "unset")
    if status != "unset":
        label.append(f"  {status}", style=_STATUS_STYLE.get(status, ""))
    if node.get("record"):
        label.append(f"  record/{node['record']}", style="dim")
    if node.get("status_message"):
        style = "red" if status == "error" else "dim"
        label.append(f"  {error_summary(node['status_message'])[:160]}", style=style)
    if wide:
        label.append(f"  span {node['span_id']}", style="dim")
        if attributes:
            label.append("  " + " ".join(f"{k}={v}" for k, v in attributes.items()), style="dim")
    return label


def _span_tree(root: dict[str, Any], *, wide: bool) -> Tree:
    """The span tree; each span with its duration, its start relative to the run's, its status,
    the record it acted on and its error."""
    origin = parse_iso(root.get("started_at"))
    tree = Tree(_span_label(root, wide=wide), guide_style="dim")

    def add(branch: Tree, node: dict[str, Any]) -> None:
        for child in node.get("children", []):
            add(branch.add(_span_label(child, wide=wide, origin=origin)), child)

    add(tree, root)
    return tree


def _spans(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("children", []):
        found.extend(_spans(child))
    return found


def trace(
    ref: Annotated[str, typer.Argument(metavar="RUN", help="a run id or run/<id>")],
    output: OutputOpt = Format.table,
) -> None:
    """A run's trace: the run, its execution attempts, steps, convergences, deletions and agent
    commands, as a tree with durations and errors (-o wide adds span ids and attributes).
    Into a pipe or a file its lines are whole, never cut at the terminal's width.

    Examples: graphenectl trace run/<id> · graphenectl trace <id> -o json
    """
    kind, ident = split_ref(ref, default="run")
    if kind.name != "run":
        raise UsageError(f"trace takes a run (run/<id> or a run id), not {kind.plural}")
    body: dict[str, Any] = session.client().get(f"runs/{ident}/trace/")
    if output in (Format.json, Format.yaml):
        emit(body, output, columns=[], name_of=lambda _: "")
        return
    if output is Format.name:
        for span in _spans(body["root"]):
            write(f"span/{span['span_id']}")
        return
    print_unwrapped(_span_tree(body["root"], wide=output is Format.wide))
    summary = f"{body['span_count']} span(s), {body['errors']} error(s), trace {body['trace_id']}"
    info(summary + (" (truncated: the oldest spans are shown)" if body.get("truncated") else ""))


__all__ = ["metrics", "trace"]
