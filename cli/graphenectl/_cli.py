"""The ``graphenectl`` command tree (typer): global options, then the commands by topic."""

from __future__ import annotations

from typing import Annotated

import typer

from graphenectl import __version__
from graphenectl._cmd_agent import agent_app
from graphenectl._cmd_artifact import artifact_app
from graphenectl._cmd_auth import ctx_app, login, whoami
from graphenectl._cmd_observe import metrics, trace
from graphenectl._cmd_read import describe, events, get, logs, tree
from graphenectl._cmd_run import run_app
from graphenectl._cmd_write import apply, delete, extend, release, stand_app, transfer
from graphenectl._output import write
from graphenectl._session import session

HELP = """Operate Graphene from the shell: records, runs, pipelines and stands.

Log in once with `graphenectl login --server URL --token-stdin`, then look with `get`, `describe`, \
`tree`, `events`, `logs`, `metrics` and `trace`; change records with `apply`, `delete`, `transfer`, \
`extend` and `release`; \
drive runs with `run start|watch|result|cancel|resume|list`; move files with `artifact get|put`; \
open a terminal on a machine with `agent shell`.

Data goes to stdout (-o table|wide|json|yaml|name); progress and hints go to stderr.

Exit codes: 0 ok, 1 failure, 2 usage or invalid input, 3 not found, 4 run failed, 130 interrupted.
"""

app = typer.Typer(
    name="graphenectl",
    help=HELP,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        write(f"graphenectl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    context: Annotated[
        str | None,
        typer.Option("--context", help="use this saved context instead of the current one (env GRAPHENE_CONTEXT)"),
    ] = None,
    request_timeout: Annotated[
        float, typer.Option("--request-timeout", min=1, help="seconds to wait for each API answer")
    ] = 30.0,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Global options (before the command)."""
    session.context = context
    session.timeout = request_timeout


SESSION = "Session"
LOOK = "Look"
CHANGE = "Change records"
RUNS = "Runs and stands"
MACHINES = "Machines"

app.command(rich_help_panel=SESSION)(login)
app.command(rich_help_panel=SESSION)(whoami)
app.add_typer(ctx_app, rich_help_panel=SESSION)
app.command(rich_help_panel=LOOK)(get)
app.command(rich_help_panel=LOOK)(describe)
app.command(rich_help_panel=LOOK)(tree)
app.command(rich_help_panel=LOOK)(events)
app.command(rich_help_panel=LOOK)(logs)
app.command(rich_help_panel=LOOK)(metrics)
app.command(rich_help_panel=LOOK)(trace)
app.command(rich_help_panel=CHANGE)(apply)
app.command(rich_help_panel=CHANGE)(delete)
app.command(rich_help_panel=CHANGE)(transfer)
app.command(rich_help_panel=CHANGE)(extend)
app.command(rich_help_panel=CHANGE)(release)
app.add_typer(run_app, rich_help_panel=RUNS)
app.add_typer(stand_app, rich_help_panel=RUNS)
app.add_typer(artifact_app, rich_help_panel=RUNS)
app.add_typer(agent_app, rich_help_panel=MACHINES)
