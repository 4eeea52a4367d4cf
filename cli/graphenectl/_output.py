"""Output: ``-o table|wide|json|yaml|name`` to stdout; progress, hints and errors to stderr.

Tables are kubectl-style (no borders, columns padded with three spaces, never wrapped) so
``grep``/``awk`` work on them; colour only when stdout is a terminal (and ``NO_COLOR`` unset).
JSON and YAML are the REST API's objects as they came; a list is a JSON array of its items.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import yaml
from rich.console import Console
from rich.text import Text

out = Console(soft_wrap=True, highlight=False, markup=False, emoji=False)
err = Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)


class Format(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"
    name = "name"


GOOD = {"ready", "succeeded", "completed"}
BAD = {"failed", "create_failed", "delete_failed", "timed_out", "unknown", "error"}
BUSY = {"pending", "creating", "updating", "queued", "running", "suspended", "waiting", "started"}
FADED = {"deleting", "deleted", "cancelled"}


def status_style(value: str) -> str | None:
    if value in GOOD:
        return "green"
    if value in BAD:
        return "bold red"
    if value in BUSY:
        return "cyan"
    if value in FADED:
        return "dim"
    if value == "drifted":
        return "magenta"
    return None


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[dict[str, Any]], Any]
    wide: bool = False
    styled: bool = False  # colour the cell by its value (phases, statuses, severities)


def cell(value: Any) -> str:
    if value is None or value == "":
        return "-" if value is None else ""
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value).replace("\n", " ")


def _visible(columns: Sequence[Column], wide: bool) -> list[Column]:
    return [c for c in columns if wide or not c.wide]


class TableWriter:
    """Rows to stdout with aligned columns; the header once. Widths grow as wider rows come."""

    def __init__(self, columns: Sequence[Column], *, wide: bool, console: Console = out) -> None:
        self.columns = _visible(columns, wide)
        self.widths = [len(c.header) for c in self.columns]
        self.console = console
        self.header_done = False

    def _line(self, values: list[str], styles: list[str | None], *, header: bool = False) -> Text:
        line = Text()
        last = len(values) - 1
        for i, (value, style) in enumerate(zip(values, styles, strict=True)):
            line.append(value, style="bold" if header else style)
            if i < last:
                line.append(" " * (self.widths[i] - len(value) + 3))
        line.rstrip()  # an empty last cell leaves no trailing blanks
        return line

    def write(self, items: Iterable[dict[str, Any]]) -> None:
        rows = [[cell(c.value(item)) for c in self.columns] for item in items]
        for row in rows:
            self.widths = [max(w, len(v)) for w, v in zip(self.widths, row, strict=True)]
        if not self.header_done:
            self.console.print(self._line([c.header for c in self.columns], [None] * len(self.columns), header=True))
            self.header_done = True
        for row in rows:
            styles = [status_style(v) if c.styled else None for c, v in zip(self.columns, row, strict=True)]
            self.console.print(self._line(row, styles))

    def render(self, items: Iterable[dict[str, Any]]) -> Text:
        """The whole table as one renderable (for a live, redrawn view)."""
        rows = [[cell(c.value(item)) for c in self.columns] for item in items]
        for row in rows:
            self.widths = [max(w, len(v)) for w, v in zip(self.widths, row, strict=True)]
        lines = [self._line([c.header for c in self.columns], [None] * len(self.columns), header=True)]
        for row in rows:
            styles = [status_style(v) if c.styled else None for c, v in zip(self.columns, row, strict=True)]
            lines.append(self._line(row, styles))
        return Text("\n").join(lines)


def to_json(data: Any, *, compact: bool = False) -> str:
    if compact:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(data, indent=2, ensure_ascii=False)


def to_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)


def write(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def emit(
    data: Any,
    fmt: Format,
    *,
    columns: Sequence[Column],
    name_of: Callable[[dict[str, Any]], str],
) -> None:
    """Print one object (a dict) or a list of objects in ``fmt``."""
    items: list[dict[str, Any]] = data if isinstance(data, list) else [data]
    if fmt is Format.json:
        write(to_json(data))
    elif fmt is Format.yaml:
        write(to_yaml(data))
    elif fmt is Format.name:
        for item in items:
            write(name_of(item))
    elif items or isinstance(data, dict):
        TableWriter(columns, wide=fmt is Format.wide).write(items)


def emit_change(
    item: dict[str, Any],
    fmt: Format,
    *,
    table: TableWriter | None,
    name_of: Callable[[dict[str, Any]], str],
) -> None:
    """One more item of a stream (watch, follow): a JSON line, a YAML document, a name or a row."""
    if fmt is Format.json:
        write(to_json(item, compact=True))
    elif fmt is Format.yaml:
        write("---\n" + to_yaml(item))
    elif fmt is Format.name:
        write(name_of(item))
    elif table is not None:
        table.write([item])


# An exception's class named with its module path where a message starts with it (at a line's
# start, or after ": "), e.g. ``graphene_sdk._errors.StepFailed: ...``: Python's own format for
# exceptions outside builtins. Users read (and catch) ``StepFailed``.
_QUALIFIED_ERROR = re.compile(r"(?m)(^|: |\()((?:[A-Za-z_][A-Za-z0-9_]*\.)+)([A-Z][A-Za-z0-9_]*)(?=:|$)")


def plain_error(text: str) -> str:
    """``text`` with exceptions named by their class only: ``graphene_sdk._errors.StepFailed:
    boom`` reads ``StepFailed: boom``."""
    return _QUALIFIED_ERROR.sub(lambda m: m.group(1) + m.group(3), text)


def error_summary(text: str) -> str:
    """One line of an error: a traceback's last line (the exception), else the first line."""
    lines = [line for line in plain_error(text).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].startswith("Traceback (most recent call last)"):
        raised = [line for line in lines if not line.startswith((" ", "\t", "Traceback", "("))]
        return raised[-1] if raised else lines[-1]
    return lines[0]


def print_unwrapped(renderable: Any) -> None:
    """A tree or other renderable on stdout; into a pipe or file at its full width: a terminal
    crops at its own width, a pipe must not be cut at 80 columns."""
    if out.is_terminal:
        out.print(renderable)
        return
    Console(width=1_000_000, soft_wrap=True, highlight=False, markup=False, emoji=False, no_color=True).print(
        renderable
    )


def info(message: str) -> None:
    """Progress and hints: stderr, so that stdout stays data."""
    err.print(Text(message, style="dim"))


def note(message: str) -> None:
    err.print(Text(message))


def warn(message: str) -> None:
    err.print(Text(f"graphenectl: warning: {message}", style="yellow"))
