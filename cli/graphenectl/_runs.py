"""What every command that waits on a run shares: reading one, and how it ended (exit 0 or 4)."""

from __future__ import annotations

from typing import Any

from graphenectl._errors import EXIT_RUN_FAILED, CliError
from graphenectl._output import error_summary, info, note, plain_error
from graphenectl._session import session
from graphenectl._time import between

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out"})


def run_view(body: dict[str, Any]) -> dict[str, Any]:
    """A run as the commands read it: the run's fields with its ``journal`` beside them, whether
    the API answers them flat or as ``{run, journal, journal_truncated}``."""
    inner = body.get("run")
    if isinstance(inner, dict):
        return {**inner, "journal": body.get("journal") or [], "journal_truncated": body.get("journal_truncated")}
    return body


def run_get(ident: str) -> dict[str, Any]:
    return run_view(session.client().get(f"runs/{ident}/"))


def title(run: dict[str, Any]) -> str:
    return f"{run['pipeline']} #{run.get('number')}"


def outcome(run: dict[str, Any]) -> str:
    """One line: how the run ended (``failed after 2.1s: StepFailed: ...``)."""
    took = between(run.get("started_at"), run.get("finished_at"))
    if run["status"] == "succeeded":
        return f"succeeded in {took}"
    return f"{run['status']} after {took}: {error_summary(str(run.get('error') or '')) or 'no error message'}"


def finish(run: dict[str, Any]) -> None:
    """Say how the run ended, as the last lines on stderr; exit 4 unless it succeeded.

    A failure's whole error (a traceback) comes first, then one line with what was raised."""
    if run["status"] == "succeeded":
        note(f"run {title(run)} {outcome(run)}; its result: graphenectl run result {run['id']}")
        return
    error = plain_error(str(run.get("error") or "")).strip()
    if "\n" in error:
        info(error)
    raise CliError(
        f"run {title(run)} {run['status']}: {error_summary(error) or 'no error message'}",
        exit_code=EXIT_RUN_FAILED,
        hint=f"graphenectl logs run/{run['id']} · graphenectl describe run/{run['id']}",
    )
