"""Entry point of the ``graphenectl`` console script and of ``python -m graphenectl``."""

from __future__ import annotations

import sys

from rich.text import Text

from graphenectl._errors import CliError
from graphenectl._output import err, plain_error


def report(exc: CliError) -> None:
    """One line saying what happened and what to do; field errors and a hint below it."""
    err.print(Text("graphenectl: error: ", style="bold red") + Text(plain_error(exc.message)))
    for path, messages in exc.fields.items():
        err.print(Text(f"  {path}: ", style="bold") + Text(plain_error("; ".join(str(m) for m in messages))))
    if exc.hint:
        err.print(Text(f"  hint: {exc.hint}", style="dim"))


def main() -> None:
    from graphenectl._cli import command

    try:
        command()(prog_name="graphenectl")
    except CliError as exc:
        report(exc)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
