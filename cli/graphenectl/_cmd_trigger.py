"""``graphenectl trigger``: what starts pipelines' runs besides people.

Triggers (``upstream``, ``cron``, ``webhook``) are declared in a pipeline's code and exist once
a revision of it is active; here they are listed, paused, resumed and their history read. A
trigger is named ``PIPELINE/NAME`` (pipeline names are unique across namespaces), the form
``-o name`` prints as ``trigger/PIPELINE/NAME``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from graphenectl._cmd_read import describe_trigger, stream
from graphenectl._errors import CliError
from graphenectl._listing import listed
from graphenectl._options import AllNamespacesOpt, IntervalOpt, NamespaceOpt, OutputOpt
from graphenectl._output import Format, TableWriter, emit, info, note
from graphenectl._resources import RESOURCES, TRIGGER_EVENT_COLUMNS, namespace_columns, trigger_ref
from graphenectl._session import session, trigger_find

TRIGGER = RESOURCES["trigger"]

trigger_app = typer.Typer(
    name="trigger",
    help="What starts pipelines' runs besides people (upstream runs, cron, webhooks): list, describe, "
    "pause, resume, and their history.",
    no_args_is_help=True,
)

RefArg = Annotated[
    str, typer.Argument(metavar="PIPELINE/NAME", help="the trigger, e.g. build/nightly (or trigger/build/nightly)")
]


class TriggerType(StrEnum):
    upstream = "upstream"
    cron = "cron"
    webhook = "webhook"


def _short(t: dict[str, Any]) -> str:
    return trigger_ref(t).removeprefix("trigger/")


@trigger_app.command("list")
def trigger_list(
    pipeline: Annotated[str | None, typer.Option("--pipeline", "-p", help="the triggers of this pipeline")] = None,
    type_: Annotated[
        TriggerType | None, typer.Option("--type", case_sensitive=False, help="only triggers of this type")
    ] = None,
    namespace: NamespaceOpt = None,
    all_namespaces: AllNamespacesOpt = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many")] = 100,
    output: OutputOpt = Format.table,
) -> None:
    """The triggers, by name: what each reacts to, whether it is paused, when it fires.

    Columns: what it reacts to (SUMMARY), whether it is paused and by whom, when it fires next
    (cron) or fired last, and the run it started last; -o wide adds its webhook path and id.

    Examples:

      graphenectl trigger list --pipeline deploy

      graphenectl trigger list --type cron -A -o wide
    """
    session.choose(namespace=namespace, all_namespaces=all_namespaces)
    chosen = session.list_namespace()
    params = {"namespace": chosen, "pipeline": pipeline, "type": type_.value if type_ else None}
    items = listed("triggers/", params, limit=limit, plural="triggers")
    if not items and output in (Format.table, Format.wide):
        where = f" in namespace {chosen!r}" if chosen else ""
        which = f" of pipeline {pipeline!r}" if pipeline else ""
        info(f"no {type_.value + ' ' if type_ else ''}triggers found{which}{where} (pipelines' code declares them)")
        return
    emit(items, output, columns=namespace_columns(TRIGGER.columns, chosen), name_of=TRIGGER.name_of)


@trigger_app.command("describe")
def trigger_describe(ref: RefArg, output: OutputOpt = Format.table) -> None:
    """One trigger: its spec, state, last run and latest events.

    The same as `graphenectl describe trigger/PIPELINE/NAME`.
    """
    trigger = trigger_find(ref)
    if output in (Format.table, Format.wide):
        describe_trigger(trigger)
    else:
        emit(trigger, output, columns=TRIGGER.columns, name_of=TRIGGER.name_of)


def _switch(ref: str, action: str, output: Format) -> dict[str, Any]:
    trigger = trigger_find(ref)
    name = _short(trigger)
    try:
        changed: dict[str, Any] = session.client().post(f"triggers/{trigger['id']}/{action}/")
    except CliError as exc:
        if exc.code != "conflict":
            raise
        other = "resume" if action == "pause" else "pause"
        raise CliError(exc.message, exit_code=exc.exit_code, hint=f"graphenectl trigger {other} {name}") from None
    emit(changed, output, columns=TRIGGER.columns, name_of=TRIGGER.name_of)
    return changed


@trigger_app.command("pause")
def trigger_pause(ref: RefArg, output: OutputOpt = Format.name) -> None:
    """Pause a trigger: it starts no run until resumed, and records each cause it skips.

    Each skipped cause (an upstream run's end, a cron instant, a webhook delivery) is an event of
    the trigger. Needs the right to update pipelines; a trigger paused already is refused (exit 1).
    """
    trigger = _switch(ref, "pause", output)
    name = _short(trigger)
    note(f"trigger {name} paused: it starts nothing; what it skips: graphenectl trigger events {name}")


@trigger_app.command("resume")
def trigger_resume(ref: RefArg, output: OutputOpt = Format.name) -> None:
    """Resume a paused trigger.

    A cron trigger fires from its next instant on: what passed while it was paused stays
    skipped. A trigger not paused is refused (exit 1).
    """
    trigger = _switch(ref, "resume", output)
    more = f", next at {trigger['next_fire_at']}" if trigger.get("next_fire_at") else ""
    note(f"trigger {_short(trigger)} resumed{more}")


@trigger_app.command("events")
def trigger_events(
    ref: RefArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new events until Ctrl-C")] = False,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="at most this many (oldest first)")] = None,
    interval: IntervalOpt = 2.0,
    output: OutputOpt = Format.table,
) -> None:
    """A trigger's history, oldest first.

    Each firing and the run it started, each cause skipped while paused, missed cron instants,
    refused starts and webhook deliveries, each pause and resume.
    """
    trigger = trigger_find(ref)
    writer = TableWriter(TRIGGER_EVENT_COLUMNS, wide=output is Format.wide)
    stream(
        f"triggers/{trigger['id']}/events/",
        {},
        follow=follow,
        interval=interval,
        output=output,
        limit=limit,
        print_item=lambda e: writer.write([e]),
        name_of=lambda e: f"event/{e['id']}",
    )
    if not follow and not writer.header_done and output in (Format.table, Format.wide):
        info(f"trigger {_short(trigger)} has no events yet")


__all__ = ["trigger_app"]
