"""A plan's entries (``POST pipelines/{name}/plan/``) as lines of text: what graphenectl prints
and the Studio shows. Standard library only (graphenectl imports it on start)."""

from __future__ import annotations

import json
import shlex
from typing import Any

_DURATIONS = ((86400, "d"), (3600, "h"), (60, "m"), (1, "s"))


def duration(seconds: float) -> str:
    """``90`` → ``90s``, ``3600`` → ``1h``: the largest unit that divides it."""
    for size, unit in _DURATIONS:
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def compact(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=False)


def entry_text(entry: dict[str, Any]) -> str:
    """One entry as a line of text."""
    op = entry["op"]
    if op == "declare":
        again = " again" if entry.get("again") else ""
        line = f"declare{again} {entry['kind']}/{entry['name']} (owner: {entry['owner']})"
        if entry.get("install"):
            install = entry["install"]
            line += f", installed over SSH on {install.get('user')}@{install.get('host')}:{install.get('port')}"
        if entry.get("spec"):
            line += f"\n    spec {compact(entry['spec'])}"
        return line
    if op == "ready":
        return f"wait until {entry['target']} is ready"
    if op == "step":
        shown = [compact(a) for a in entry.get("args", [])]
        shown += [f"{k}={compact(v)}" for k, v in (entry.get("kwargs") or {}).items()]
        return f"step {entry['name']}: {entry['function']}({', '.join(shown)})"
    if op == "exec":
        env = f" env {compact(entry['env'])}" if entry.get("env") else ""
        return f"exec on {entry['agent']}: {shlex.join(entry['argv'])}{env} (assumed: {entry['assumed']})"
    if op == "call":
        return f"run {entry['function']}() on {entry['agent']} with {compact(entry.get('args', []))}"
    if op == "put_file":
        return f"put_file {entry['path']} on {entry['agent']} ({entry['size']} bytes, mode {entry['mode']})"
    if op == "get_file":
        return f"get_file {entry['path']} from {entry['agent']}"
    if op == "run":
        return f"start child run {entry['pipeline']} with {compact(entry['inputs'])}"
    if op == "to_stand":
        keep = f" for {duration(entry['keep_for'])}" if entry.get("keep_for") else ""
        return f"hand {entry['target']} to the {entry['stand']}{keep}"
    if op == "delete":
        return f"delete {entry['target']}"
    if op == "sleep":
        return f"sleep {duration(entry['seconds'])}"
    if op == "log":
        return f"log ({entry['level']}): {entry['message']}"
    if op == "assume":
        return f"assume {entry['value']} is {entry['assumed']} (at {entry['where']})"
    rest = {k: v for k, v in entry.items() if k not in ("seq", "run", "op", "uses")}
    return f"{op} {compact(rest)}"
