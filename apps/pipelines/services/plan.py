"""Plans: what a run of a pipeline would do, with nothing done and nothing written.

The pipeline's code runs once in a recording pass (``graphene_sdk._plan``, on the testing
kit's world): declarations, steps, child runs and agent calls are recorded in order, with
placeholders where the run would read a value from outside. It runs in a fresh subprocess
with a time limit (``python -I -m graphene_sdk._plan plan``), as a revision is described,
so that nothing the code does reaches this process: a pipeline that raises, loops or exits
is a 422 saying so, never a 500 or a stuck server.

* A revision's code (a pushed directory, a git source, ``GRAPHENE_PIPELINE_DIRS``) is
  imported from its unpacked tree, with none of this process's environment (it holds the
  database's and the secrets' keys), as describing it is.
* Code installed on the workers (``GRAPHENE_PIPELINE_MODULES``) is the operator's own: it is
  imported from this process's import path with this process's environment, as a worker
  imports it (it may read settings as it is imported).

Nothing is written to the database: the definition and the revision are read, the inputs
validated as a start validates them (the same errors), and the answer is built from the
subprocess's document alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from django.conf import settings
from graphene_sdk import _delivery

from apps.core.errors import GrapheneError, NotFound
from apps.pipelines.delivery import loader
from apps.pipelines.models import Pipeline, Revision
from apps.pipelines.services.definitions import definition_get, inputs_validate, pipelines_load

TRACEBACK_CHARS = 6000
# The largest plan document read back (a plan holds at most graphene_sdk._plan.MAX_ENTRIES entries).
MAX_ANSWER_BYTES = 16 * 1024**2


class PlanFailed(GrapheneError):
    """The pipeline cannot be planned: its code raised (the traceback is in the detail), does
    not import, or takes longer than ``GRAPHENE_PLAN_TIMEOUT_SECONDS``. Nothing was written."""

    status_code = 422
    code = "plan_failed"


def _bare_env() -> dict[str, str]:
    return {key: os.environ[key] for key in ("PATH", "LANG", "LC_ALL", "TZ", "HOME") if key in os.environ}


def _where(name: str, revision: Revision | None) -> tuple[dict[str, Any], dict[str, str], str, Revision | None]:
    """The code to import (part of the request), the environment, the directory to run in and
    the revision planned (``None``: code installed on the workers)."""
    if revision is None and name in pipelines_load():
        request: dict[str, Any] = {"modules": list(settings.GRAPHENE_PIPELINE_MODULES), "path": list(sys.path)}
        return request, dict(os.environ), os.getcwd(), None
    if revision is None:
        row = Pipeline.objects.select_related("revision").filter(name=name, revision__isnull=False).first()
        if row is None or row.revision is None:  # deactivated since definition_get read it
            raise NotFound(f"no pipeline {name!r} is loaded")
        revision = row.revision
    tree = loader.unpacked(revision.digest)
    request = {"tree": str(tree), "package": _delivery.package_name(revision.digest, revision.namespace)}
    return request, _bare_env(), str(tree), revision


def _run(request: dict[str, Any], env: dict[str, str], cwd: str) -> dict[str, Any]:
    timeout = float(settings.GRAPHENE_PLAN_TIMEOUT_SECONDS)
    argv = [sys.executable, "-I", "-m", "graphene_sdk._plan", "plan"]
    try:
        done = subprocess.run(
            argv, input=json.dumps(request), capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
        )
    except subprocess.TimeoutExpired:
        raise PlanFailed(
            f"planning took longer than {timeout:g}s (GRAPHENE_PLAN_TIMEOUT_SECONDS) and was stopped: the pipeline's "
            "code loops or waits in its own body or as it is imported (a plan runs no step and waits on nothing)",
            code="plan_timeout",
        ) from None
    out = done.stdout.strip()
    try:
        answer = json.loads(out.splitlines()[-1]) if out and len(out) <= MAX_ANSWER_BYTES else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise PlanFailed(
            f"planning failed (the planning process exited {done.returncode}): "
            f"{done.stderr.strip()[-TRACEBACK_CHARS:] or 'it said nothing'}"
        )
    if not answer.get("ok"):
        trace = str(answer.get("traceback") or "").strip()
        detail = str(answer.get("error") or "the pipeline cannot be planned")
        raise PlanFailed(detail + (f"\n{trace[-TRACEBACK_CHARS:]}" if trace else ""))
    plan: dict[str, Any] = answer["plan"]
    return plan


def pipeline_plan(*, name: str, inputs: Any, actor: Any = None, revision: Revision | None = None) -> dict[str, Any]:
    """The plan of a run of pipeline ``name`` with ``inputs``: what it would declare (kinds,
    names, owners, specs with secret names only), the steps, child runs and agent calls it
    would make, in order, with placeholders where it would read a value from outside; and the
    tree its records would form. ``revision``: plan that revision (a draft) instead of the
    active one.

    Who may see the pipeline may plan it (``get`` on pipelines, and on revisions for a
    draft): a plan does nothing and writes nothing. The inputs are validated as a start
    validates them (``ValidationFailed`` by field); ``PlanFailed`` (422) when the code raises,
    does not import or takes too long.
    """
    if revision is not None and name not in revision.pipeline_names():
        raise NotFound(
            f"revision {revision.short} defines no pipeline {name!r}; "
            f"it defines: {', '.join(revision.pipeline_names()) or 'none'}"
        )
    definition = definition_get(name, user=actor, revision=revision)
    clean = inputs_validate(definition, inputs)
    request, env, cwd, planned = _where(name, revision)
    request.update(pipeline=name, namespace=definition.namespace, inputs=clean)
    plan = _run(request, env, cwd)
    return {
        "pipeline": name,
        "namespace": definition.namespace,
        "revision": planned.digest if planned is not None else None,
        "inputs": clean,
        "complete": plan["complete"],
        "stopped": plan["stopped"],
        "entries": plan["entries"],
        "tree": plan["tree"],
        "output": plan["output"],
    }
