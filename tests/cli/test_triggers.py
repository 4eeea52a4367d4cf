"""graphenectl and triggers, against the shared web server and workers: ``trigger list`` (and
``get triggers``) shows what starts each pipeline's runs, ``trigger pause|resume`` switch one
(refusing a second pause and a viewer, saying why), ``trigger events`` and ``describe`` tell
its history; ``run list`` and ``describe run`` show each run's cause — a person, or the
upstream run whose end fired a trigger.

``sample.cli``'s triggers are reconciled from specs as a revision's activation would make them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.pipelines import services
from apps.pipelines.models import Run, Trigger
from apps.pipelines.services import triggers
from tests import factories
from tests.conftest import Worker, wait_for
from tests.harness.embedded import Ctl, Result
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

SPECS: list[dict[str, Any]] = [
    {"name": "nightly", "type": "cron", "schedule": "0 3 * * *", "timezone": "UTC", "inputs": {}, "missed": "skip"},
    {"name": "after-noop", "type": "upstream", "pipeline": "sample.noop", "on": "succeeded"},
]


@pytest.fixture
def ctl(web: WebServer, user: Any, tmp_path: Path) -> Ctl:
    """graphenectl as alice, a developer of the default namespace."""
    return Ctl(tmp_path / "config", **web.client_env(), GRAPHENE_TOKEN=factories.api_token(user))


@pytest.fixture
def viewer(web: WebServer, django_user_model: Any, tmp_path: Path) -> Ctl:
    vera = django_user_model.objects.create_user(username="vera", password="pw")
    factories.bind(vera, "viewer")
    return Ctl(tmp_path / "vera", **web.client_env(), GRAPHENE_TOKEN=factories.api_token(vera))


@pytest.fixture
def declared() -> None:
    """``sample.cli`` with a daily cron trigger and one fired by ``sample.noop``'s successes."""
    row = services.pipeline_sync(services.definition_get("sample.cli"))
    triggers.triggers_reconcile(row, SPECS)


def row(result: Result, *first: str) -> str:
    """The table line whose first cells are ``first``."""
    for line in result.out.splitlines():
        if line.split()[: len(first)] == list(first):
            return line
    raise AssertionError(f"no row {first} in\n{result.out}")


def test_trigger_list_pause_resume_and_events(ctl: Ctl, viewer: Ctl, declared: None) -> None:
    listed = ctl.ok("trigger", "list", "--pipeline", "sample.cli", "-n", "default")
    header = listed.out.splitlines()[0]
    assert header.split()[:5] == ["PIPELINE", "NAME", "TYPE", "SUMMARY", "PAUSED"]
    assert "NEXT/LAST FIRED" in header
    assert "LAST RUN" in header
    cron = row(listed, "sample.cli", "nightly", "cron")
    assert "cron 0 3 * * * (UTC, missed: skip)" in cron
    assert "next in " in cron
    assert "never fired" in cron
    assert " no " in cron
    assert "upstream sample.noop on succeeded" in row(listed, "sample.cli", "after-noop", "upstream")
    # Every namespace (none chosen): a NAMESPACE column first; -o json: the API's objects.
    assert ctl.ok("trigger", "list").out.split()[:2] == ["NAMESPACE", "PIPELINE"]
    body = ctl.ok("trigger", "list", "--pipeline", "sample.cli", "-o", "json").json()
    assert [(t["name"], t["type"], t["paused"]) for t in body] == [
        ("after-noop", "upstream", False),
        ("nightly", "cron", False),
    ]
    assert ctl.ok("trigger", "list", "--type", "cron", "-o", "name").out.split() == ["trigger/sample.cli/nightly"]
    assert ctl.ok("get", "triggers", "--pipeline", "sample.cli", "-o", "name").out.split() == [
        "trigger/sample.cli/after-noop",
        "trigger/sample.cli/nightly",
    ]
    assert ctl.ok("get", "triggers", "sample.cli/nightly", "-o", "json").json()["type"] == "cron"

    # A viewer reads them, and may not pause one: the server's reason, nothing changed.
    assert "nightly" in viewer.ok("trigger", "list").out
    refused = viewer("trigger", "pause", "sample.cli/nightly")
    assert refused.code == 1, refused
    assert "vera may not update pipelines in namespace 'default'" in refused.err
    assert not Trigger.objects.get(name="nightly").paused

    paused = ctl.ok("trigger", "pause", "sample.cli/nightly")
    assert paused.out.split() == ["trigger/sample.cli/nightly"]
    assert "trigger sample.cli/nightly paused: it starts nothing" in paused.err
    cron = row(ctl.ok("trigger", "list", "-n", "default"), "sample.cli", "nightly")
    assert "yes (by alice)" in cron
    assert "next: paused" in cron
    again = ctl("trigger", "pause", "trigger/sample.cli/nightly")
    assert again.code == 1, again
    assert "trigger sample.cli/nightly is paused already" in again.err
    assert "hint: graphenectl trigger resume sample.cli/nightly" in again.err

    described = ctl.ok("describe", "trigger/sample.cli/nightly").out
    assert "Paused:" in described
    assert "yes, by alice since" in described
    assert "Fires:" in described
    assert "not while paused" in described
    assert ctl.ok("trigger", "describe", "sample.cli/nightly", "-o", "json").json()["paused_by"] == "alice"

    resumed = ctl.ok("trigger", "resume", "sample.cli/nightly", "-o", "json").json()
    assert (resumed["paused"], resumed["paused_by"]) == (False, None)
    assert resumed["next_fire_at"]
    assert " no " in row(ctl.ok("trigger", "list", "-n", "default"), "sample.cli", "nightly")
    not_paused = ctl("trigger", "resume", "sample.cli/nightly")
    assert not_paused.code == 1, not_paused
    assert "is not paused already" in not_paused.err, not_paused

    history = ctl.ok("trigger", "events", "sample.cli/nightly")
    reasons = [line.split()[2] for line in history.out.splitlines()[1:]]
    assert reasons == ["Paused", "Resumed"]
    assert all(line.rstrip().endswith("alice") for line in history.out.splitlines()[1:])
    assert [e["reason"] for e in ctl.ok("trigger", "events", "sample.cli/nightly", "-o", "json").json()] == [
        "Paused",
        "Resumed",
    ]

    # Names that name nothing: which triggers exist, or how to write one.
    missing = ctl("trigger", "pause", "sample.cli/nope")
    assert missing.code == 3, missing
    assert "pipeline 'sample.cli' has no trigger 'nope'; its triggers: after-noop, nightly" in missing.err
    nothing = ctl("trigger", "events", "sample.noop/nightly")
    assert nothing.code == 3, nothing
    assert "no trigger 'nightly' of pipeline 'sample.noop'" in nothing.err, nothing
    bare = ctl("trigger", "pause", "nightly")
    assert bare.code == 2, bare
    assert "write it as PIPELINE/NAME" in bare.err, bare


def test_runs_show_their_cause_a_person_or_the_upstream_run(ctl: Ctl, declared: None, workers: list[Worker]) -> None:
    upstream = ctl.ok("run", "start", "sample.noop", "-i", "steps=1", "--watch", "-o", "json").json()
    # Its success fired sample.cli's upstream trigger: a run of sample.cli with that cause.
    started = wait_for(
        lambda: Run.objects.filter(pipeline__name="sample.cli", trigger__name="after-noop").first(),
        timeout=60,
        what="the upstream trigger to start a run of sample.cli",
    )
    assert started is not None
    name = f"sample.noop#{upstream['number']}"

    noop = ctl.ok("run", "list", "--pipeline", "sample.noop", "-n", "default")
    assert noop.out.splitlines()[0].split()[-1] == "CAUSE"
    assert row(noop, upstream["id"]).rstrip().endswith("user alice")
    cli = ctl.ok("run", "list", "--pipeline", "sample.cli", "-n", "default")
    assert row(cli, str(started.pk)).rstrip().endswith(f"run {name} succeeded (trigger after-noop)")
    assert ctl.ok("get", "runs", str(started.pk), "-o", "json").json()["cause"] == {
        "type": "upstream",
        "trigger": "after-noop",
        "run": upstream["id"],
        "name": name,
        "status": "succeeded",
    }

    def cause_of(run_id: str) -> str:
        described = ctl.ok("describe", f"run/{run_id}").out
        return next(line for line in described.splitlines() if line.startswith("Cause:"))

    assert cause_of(upstream["id"]).split(None, 1)[1] == "user alice"
    assert cause_of(str(started.pk)).split(None, 1)[1] == (
        f"run {name} succeeded (trigger after-noop) · run/{upstream['id']}"
    )
    # The trigger says what it started last, and its history says why.
    fired = ctl.ok("trigger", "list", "--pipeline", "sample.cli", "-o", "json").json()
    assert {t["name"]: t["last_run"] for t in fired}["after-noop"] == str(started.pk)
    events = ctl.ok("trigger", "events", "sample.cli/after-noop", "-o", "json").json()
    assert [(e["reason"], e["run"]) for e in events] == [("Fired", str(started.pk))]
