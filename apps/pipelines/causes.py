"""Why a run started: its ``cause``, as stored on the run and told in one line.

    {"type": "user", "user": "alice"}
    {"type": "parent", "run": "<id>", "name": "release#4"}
    {"type": "upstream", "trigger": "after-build", "run": "<id>", "name": "build#12", "status": "succeeded"}
    {"type": "cron", "trigger": "nightly", "instant": "2026-12-05T03:00:00+00:00", "schedule": "0 3 * * *"}
    {"type": "webhook", "trigger": "push", "delivery": "<delivery id>", "event": "push"}

A run made before causes were recorded has ``{}``: its cause is read off who started it and its
parent run.
"""

from __future__ import annotations

from typing import Any

from apps.pipelines.models import Run


def user_cause(actor: Any) -> dict[str, Any]:
    if actor is not None and getattr(actor, "is_authenticated", False):
        return {"type": "user", "user": actor.get_username()}
    return {"type": "system"}


def parent_cause(parent: Run) -> dict[str, Any]:
    return {"type": "parent", "run": str(parent.pk), "name": str(parent)}


def cause_of(run: Run) -> dict[str, Any]:
    """The run's cause (derived for runs made before causes were stored)."""
    if run.cause:
        return dict(run.cause)
    if run.parent_run_id is not None:
        return {"type": "parent", "run": str(run.parent_run_id), "name": str(run.parent_run) if run.parent_run else ""}
    if run.created_by_id is not None and run.created_by is not None:
        return {"type": "user", "user": run.created_by.get_username()}
    return {"type": "system"}


def cause_text(cause: dict[str, Any]) -> str:
    """One line: ``user alice``, ``run build#12 succeeded (trigger after-build)``, ``cron
    2026-12-05T03:00:00+00:00 (nightly)``, ``webhook push delivery 72d3… (push)``."""
    kind = cause.get("type")
    if kind == "user":
        return f"user {cause.get('user', '?')}"
    if kind == "parent":
        return f"parent run {cause.get('name') or cause.get('run')}"
    if kind == "upstream":
        upstream = cause.get("name") or cause.get("run")
        return f"run {upstream} {cause.get('status', 'ended')} (trigger {cause.get('trigger')})"
    if kind == "cron":
        return f"cron {cause.get('instant')} (trigger {cause.get('trigger')})"
    if kind == "webhook":
        return f"webhook {cause.get('event')} delivery {cause.get('delivery')} (trigger {cause.get('trigger')})"
    return "system"
