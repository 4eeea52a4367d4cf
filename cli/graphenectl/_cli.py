"""The ``graphenectl`` command tree (typer): global options, then the commands by topic."""

from __future__ import annotations

from typing import Annotated, Any

import typer
import typer.core
import typer.main

from graphenectl import __version__
from graphenectl._cmd_access import namespace_app, role_app
from graphenectl._cmd_account import account_app, token_app
from graphenectl._cmd_agent import agent_app
from graphenectl._cmd_artifact import artifact_app
from graphenectl._cmd_audit import audit
from graphenectl._cmd_auth import ctx_app, login, whoami
from graphenectl._cmd_observe import metrics, trace
from graphenectl._cmd_pipeline import pipeline_app
from graphenectl._cmd_read import describe, events, get, logs, tree
from graphenectl._cmd_run import run_app
from graphenectl._cmd_secret import secret_app
from graphenectl._cmd_source import source_app
from graphenectl._cmd_trigger import trigger_app
from graphenectl._cmd_write import apply, delete, extend, protect, release, stand_app, transfer, unprotect
from graphenectl._options import AllNamespacesOpt, NamespaceOpt
from graphenectl._output import write
from graphenectl._session import session

HELP = """Operate Graphene from the shell: records, runs, pipelines and stands.

Log in once with `graphenectl login --server URL --token-stdin`, then look with `get`, `describe`, \
`tree`, `events`, `logs`, `metrics` and `trace`, and at who changed what with `audit`; change records \
with `apply`, `delete`, `transfer`, `extend`, `release`, `protect` and `unprotect`; \
drive runs with `run start|watch|result|cancel|resume|list`; deliver pipeline code with \
`pipeline push|activate|revisions|history` or from git with `source apply|sync|list|get|delete`; \
see and pause what starts runs with `trigger list|describe|pause|resume|events`; \
move files with `artifact get|put`; \
enroll a machine with `agent create` and open a terminal on it with `agent shell`; keep secrets \
with `secret set|list`. Who may do what where: `namespace`, `role` (and `role bind`); your API \
tokens: `token list|create|revoke`; programs' identities: `account create|token|revoke|list`.

Lists show the namespace chosen with -n (or GRAPHENE_NAMESPACE, or the context's: \
`ctx set-namespace`); with none chosen, or -A, every namespace you may see.

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
    namespace: NamespaceOpt = None,
    all_namespaces: AllNamespacesOpt = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Global options (before the command; a command's own -n/-A win)."""
    session.context = context
    session.timeout = request_timeout
    session.choose(namespace=namespace, all_namespaces=all_namespaces)


SESSION = "Session"
LOOK = "Look"
CHANGE = "Change records"
RUNS = "Pipelines, runs and stands"
MACHINES = "Machines"
ACCESS = "Access"

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
app.command(rich_help_panel=LOOK)(audit)
app.command(rich_help_panel=CHANGE)(apply)
app.command(rich_help_panel=CHANGE)(delete)
app.command(rich_help_panel=CHANGE)(transfer)
app.command(rich_help_panel=CHANGE)(extend)
app.command(rich_help_panel=CHANGE)(release)
app.command(rich_help_panel=CHANGE)(protect)
app.command(rich_help_panel=CHANGE)(unprotect)
app.add_typer(pipeline_app, rich_help_panel=RUNS)
app.add_typer(run_app, rich_help_panel=RUNS)
app.add_typer(source_app, rich_help_panel=RUNS)
app.add_typer(trigger_app, rich_help_panel=RUNS)
app.add_typer(stand_app, rich_help_panel=RUNS)
app.add_typer(artifact_app, rich_help_panel=RUNS)
app.add_typer(agent_app, rich_help_panel=MACHINES)
app.add_typer(secret_app, rich_help_panel=MACHINES)
app.add_typer(namespace_app, rich_help_panel=ACCESS)
app.add_typer(role_app, rich_help_panel=ACCESS)
app.add_typer(token_app, rich_help_panel=ACCESS)
app.add_typer(account_app, rich_help_panel=ACCESS)


# How an option's value reads in --help, as click names it (typer would print Python types).
_VALUE_NAMES = {"str": "TEXT", "list[str]": "TEXT", "int": "INTEGER", "float": "NUMBER"}


def _tidy(command: Any) -> None:
    """Help that reads as a command line's: a flag shows no value (typer prints ``<bool>``), an
    option its value as click names it (``TEXT``, ``INTEGER``, ``NUMBER``, or its choices), and
    an argument only its metavar, which already says what it is.

    ``command`` is typer's own (vendored) click command: walked by its attributes."""
    for param in command.params:
        if isinstance(param, typer.core.TyperOption):
            if param.is_flag or param.count:
                param.metavar = ""
            elif param.metavar is None:
                choices = param.type_descriptor.choices
                if choices:
                    param.metavar = "|".join(str(getattr(c, "value", c)) for c in choices)
                else:
                    shown = param.display_type(None).strip("<>").removesuffix(" range")  # type: ignore[arg-type]  # a context only normalizes choices
                    param.metavar = _VALUE_NAMES.get(shown, shown.upper())
        elif isinstance(param, typer.core.TyperArgument):
            param.display_type_rich = _no_type  # type: ignore[method-assign]  # its metavar names it
    made = command.get_help_option  # -h/--help is made when help is asked for: a flag too

    def help_option(ctx: Any) -> Any:
        option = made(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        _tidy(sub)


def _no_type(*_: Any, **__: Any) -> None:
    return None


def command() -> Any:
    """The ``graphenectl`` command (typer's click command), its help tidied (``_tidy``)."""
    built = typer.main.get_command(app)
    _tidy(built)
    return built
