"""Triggers: declared in code and reconciled on activation (created, replaced, deleted, an
upstream cycle refused); upstream runs' ends, cron instants (with real beat processes: two at
once, a restart, an outage) and signed webhook deliveries each start exactly one run, which
carries its cause; a paused trigger starts nothing and records what it skipped."""

from __future__ import annotations

import hashlib
import hmac
import json
import textwrap
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import urllib3
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from graphene_sdk import Client as GrapheneClient
from graphene_sdk import _delivery
from rest_framework.test import APIClient

from apps.pipelines import services
from apps.pipelines.models import Pipeline, PipelineEvent, Run, Trigger, TriggerEvent, TriggerFiring
from apps.pipelines.services import triggers
from apps.secrets import services as secrets
from tests import factories
from tests.conftest import running_beat, wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]

HEADER = """
from typing import Any
from pydantic import BaseModel
from graphene_sdk import Context, cron, pipeline, upstream, webhook
"""


def tree(base: Path, code: str) -> Path:
    root = base / f"code-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    (root / "flows.py").write_text(textwrap.dedent(HEADER) + textwrap.dedent(code))
    return root


def push(api: APIClient, directory: Path) -> Any:
    data = _delivery.pack(directory, max_bytes=10 * 1024**2)
    return api.generic("POST", "/api/v1/revisions/?namespace=default", data, content_type="application/gzip")  # type: ignore[arg-type]


def pushed(api: APIClient, base: Path, code: str) -> Any:
    answer = push(api, tree(base, code))
    assert answer.status_code in (200, 201), answer.content
    return answer.json()


def ended(run_id: Any, timeout: float = 60) -> Run:
    wait_for(
        lambda: Run.objects.get(pk=run_id).status in {"succeeded", "failed", "cancelled", "timed_out"},
        timeout=timeout,
        what=f"run {run_id} to end",
    )
    return Run.objects.select_related("pipeline").get(pk=run_id)


def runs_of(name: str) -> list[Run]:
    return list(Run.objects.filter(pipeline__name=name).order_by("number"))


# --- declared in code, reconciled on activation ----------------------------------------------------

CHAIN = """
class In(BaseModel):
    got: str = ""
    event: dict[str, Any] = {{}}


class Out(BaseModel):
    version: str


@pipeline("t-build", inputs=In)
def build(ctx: Context, inputs: In) -> Out:
    return Out(version="{version}")


@pipeline("t-deploy", inputs=In, triggers=[{triggers}])
def deploy(ctx: Context, inputs: In) -> Out:
    return Out(version=inputs.got or str(inputs.event.get("ref", "")))
"""


def chain(version: str, triggers: str) -> str:
    return CHAIN.format(version=version, triggers=triggers)


def test_activation_creates_replaces_and_deletes_triggers_each_with_an_event(api: APIClient, tmp_path: Path) -> None:
    first = (
        'upstream("t-build", inputs=lambda up: {"got": up.outputs["version"]}), '
        'cron("0 3 * * *", timezone="Europe/Berlin", name="nightly"), '
        'webhook("push", secret="HOOK")'
    )
    pushed(api, tmp_path, chain("1", first))
    made = {t.name: t for t in Trigger.objects.filter(pipeline__name="t-deploy")}
    assert set(made) == {"after-t-build", "nightly", "push"}
    assert made["after-t-build"].upstream == "t-build"
    assert made["after-t-build"].spec["on"] == "succeeded"
    nightly = made["nightly"]
    assert nightly.next_fire_at is not None
    assert nightly.next_fire_at > datetime.now(UTC)
    # 03:00 in Berlin is 01:00 or 02:00 UTC, depending on the season.
    assert nightly.next_fire_at.astimezone(UTC).hour in (1, 2)
    assert nightly.next_fire_at.minute == 0
    reasons = list(PipelineEvent.objects.filter(pipeline__name="t-deploy").values_list("reason", "data__trigger"))
    assert reasons[0] == ("Activated", None)
    assert sorted(reasons[1:]) == [("TriggerCreated", n) for n in ("after-t-build", "nightly", "push")]

    assert api.post(f"/api/v1/triggers/{nightly.pk}/pause/").status_code == 200
    mark = PipelineEvent.objects.order_by("-id").values_list("id", flat=True)[0]
    second = 'upstream("t-build", inputs=lambda up: {"got": up.outputs["version"]}), cron("0 4 * * *", name="nightly")'
    pushed(api, tmp_path, chain("2", second))
    now = {t.name: t for t in Trigger.objects.filter(pipeline__name="t-deploy")}
    assert set(now) == {"after-t-build", "nightly"}
    assert now["after-t-build"].pk == made["after-t-build"].pk  # unchanged: the same trigger
    assert now["nightly"].pk != nightly.pk
    assert now["nightly"].spec["schedule"] == "0 4 * * *"
    assert now["nightly"].paused, "a replaced trigger that was paused stays paused"
    latest = PipelineEvent.objects.filter(pipeline__name="t-deploy", id__gt=mark).exclude(reason="Activated")
    assert dict(latest.values_list("data__trigger", "reason")) == {
        "nightly": "TriggerReplaced",
        "push": "TriggerDeleted",
    }
    assert "(still paused)" in latest.get(reason="TriggerReplaced").message


@pytest.mark.parametrize(
    ("declared", "refusal"),
    [
        ('cron("61 * * * *")', "is not a cron expression"),
        ('cron("0 3 * * *", timezone="Mars/Olympus")', "unknown timezone 'Mars/Olympus'"),
        ('cron("0 3 * * *", inputs={"got": 5})', "its inputs are not valid"),
        ('upstream("t-deploy")', "cycle"),
    ],
)
def test_triggers_that_cannot_work_refuse_the_revision_and_change_nothing(
    api: APIClient, tmp_path: Path, declared: str, refusal: str
) -> None:
    answer = push(api, tree(tmp_path, chain("1", declared)))
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"] == "revision_refused"
    assert refusal in answer.json()["detail"]
    assert not Trigger.objects.exists()
    assert not Pipeline.objects.filter(name="t-deploy").exists()


def test_a_webhook_trigger_needs_the_reserved_event_input(api: APIClient, tmp_path: Path) -> None:
    code = """
    class In(BaseModel):
        ref: str = ""

    @pipeline("t-hookless", inputs=In, triggers=[webhook("push", secret="HOOK")])
    def hookless(ctx: Context, inputs: In) -> None:
        pass
    """
    answer = push(api, tree(tmp_path, code))
    assert answer.status_code == 400
    assert "reserved input 'event'" in answer.json()["detail"]


def test_an_upstream_cycle_across_revisions_is_refused_naming_it(api: APIClient, tmp_path: Path) -> None:
    base = """
    class In(BaseModel):
        pass

    @pipeline("{name}", inputs=In, triggers=[upstream("{up}")])
    def flow(ctx: Context, inputs: In) -> None:
        pass
    """
    pushed(api, tmp_path, base.format(name="t-a", up="t-b"))
    pushed(api, tmp_path, base.format(name="t-b", up="t-c"))
    answer = push(api, tree(tmp_path, base.format(name="t-c", up="t-a")))
    assert answer.status_code == 400
    assert "t-a → t-c → t-b → t-a" in answer.json()["detail"], answer.json()["detail"]
    assert not Pipeline.objects.filter(name="t-c").exists()


# --- upstream -----------------------------------------------------------------------------------------


def test_an_upstream_success_starts_the_downstream_once_with_its_cause(
    api: APIClient, tmp_path: Path, workers: Any
) -> None:
    pushed(api, tmp_path, chain("7", 'upstream("t-build", inputs=lambda up: {"got": up.outputs["version"] + "!"})'))
    started = api.post("/api/v1/pipelines/t-build/runs/", {"inputs": {}}, format="json")
    assert started.status_code == 201, started.content
    build = ended(started.json()["id"])
    assert build.status == "succeeded"
    wait_for(lambda: runs_of("t-deploy"), timeout=30, what="the downstream run to start")
    deploy = ended(runs_of("t-deploy")[0].pk)
    assert deploy.status == "succeeded"
    assert deploy.outputs == {"version": "7!"}
    assert deploy.cause == {
        "type": "upstream",
        "trigger": "after-t-build",
        "run": str(build.pk),
        "name": f"t-build#{build.number}",
        "status": "succeeded",
    }
    shown = api.get(f"/api/v1/runs/{deploy.pk}/").json()
    assert shown["cause"]["run"] == str(build.pk)
    assert shown["cause_text"] == f"run t-build#{build.number} succeeded (trigger after-t-build)"
    assert api.get(f"/api/v1/runs/{build.pk}/").json()["cause_text"] == "user alice"
    fired = TriggerEvent.objects.get(reason="Fired")
    assert (fired.run_id, fired.data) == (deploy.pk, {"cause": deploy.cause})
    assert fired.message == f"started {deploy} for {shown['cause_text']}"
    assert Trigger.objects.get(pk=fired.trigger_id).last_run_id == deploy.pk
    assert TriggerFiring.objects.get().status == "started"
    # The same end seen again (a replayed finish, a second process) starts nothing more.
    triggers.upstream_ended(build)
    assert TriggerFiring.objects.count() == 1
    # Given a list, the end's firings join it as written (processed by whoever took the list),
    # their triggers and pipelines loaded with them.
    seen_again: list[TriggerFiring] = []
    triggers.upstream_ended(build, seen_again)
    with CaptureQueriesContext(connection) as reads:
        found = [(f.pk, f.status, f.run_id, str(f.trigger), f.cause, f.trigger.pipeline.revision) for f in seen_again]
    firing = TriggerFiring.objects.get()
    assert found == [(firing.pk, "started", deploy.pk, "t-deploy/after-t-build", deploy.cause, deploy.revision)]
    assert len(reads) == 0, [q["sql"] for q in reads.captured_queries]
    assert len(runs_of("t-deploy")) == 1
    # A process that died after the start but before its bookkeeping left the firing pending:
    # the second try meets the first start at the key's unique constraint and takes its run.
    TriggerFiring.objects.update(status="pending", run=None, done_at=None)
    again = triggers.firing_process(TriggerFiring.objects.get().pk)
    assert again is not None
    assert (again.status, again.run_id) == ("started", deploy.pk)
    assert len(runs_of("t-deploy")) == 1


def test_upstream_on_failed_ignores_successes_and_a_paused_trigger_records_what_it_skipped(
    api: APIClient, tmp_path: Path, workers: Any
) -> None:
    pushed(api, tmp_path, chain("1", 'upstream("t-build", on="failed"), upstream("t-build", name="any-end", on="any")'))
    on_any = Trigger.objects.get(name="any-end")
    assert api.post(f"/api/v1/triggers/{on_any.pk}/pause/").status_code == 200
    build = ended(api.post("/api/v1/pipelines/t-build/runs/", {"inputs": {}}, format="json").json()["id"])
    assert build.status == "succeeded"
    wait_for(
        lambda: TriggerEvent.objects.filter(trigger=on_any, reason="Skipped").exists(),
        timeout=30,
        what="the paused trigger to record the end it skipped",
    )
    skipped = TriggerEvent.objects.get(trigger=on_any, reason="Skipped")
    assert f"t-build#{build.number} succeeded" in skipped.message
    assert not runs_of("t-deploy"), "a failed-only trigger and a paused one started nothing"
    assert not Trigger.objects.get(name="after-t-build").events.exists()


# --- webhooks -----------------------------------------------------------------------------------------

HOOK_SECRET = "s3cret-for-hooks"


def signed(body: bytes, secret: str = HOOK_SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def deliver(client: Client, body: bytes, *, delivery: str, signature: str | None, **headers: str) -> Any:
    extra: dict[str, Any] = {"HTTP_X_GITHUB_DELIVERY": delivery, "HTTP_X_GITHUB_EVENT": "push", **headers}
    if signature is not None:
        extra["HTTP_X_HUB_SIGNATURE_256"] = signature
    return client.post("/hooks/t-deploy/push", body, content_type="application/json", **extra)


@pytest.fixture
def hooked(api: APIClient, tmp_path: Path, user: Any) -> Trigger:
    secrets.secret_create(name="HOOK", value=HOOK_SECRET, actor=user)
    pushed(api, tmp_path, chain("1", 'webhook("push", secret="HOOK", inputs=lambda e: {"got": e["ref"]})'))
    return Trigger.objects.get(name="push")


def test_a_signed_delivery_over_the_real_server_starts_one_run_with_the_body_as_event(
    hooked: Trigger, web: Any, workers: Any, user: Any
) -> None:
    body = json.dumps({"ref": "refs/heads/main", "after": "abc123"}).encode()
    http = urllib3.PoolManager(ca_certs=str(web.ca_file))
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": "d-1",
        "X-Hub-Signature-256": signed(body),
    }
    first = http.request("POST", f"{web.url}/hooks/t-deploy/push", body=body, headers=headers)
    assert first.status == 201, first.data
    answer = json.loads(first.data)
    run = ended(answer["run"])
    assert run.status == "succeeded"
    assert run.outputs == {"version": "refs/heads/main"}
    assert run.inputs["event"] == {"ref": "refs/heads/main", "after": "abc123"}
    assert run.cause == {"type": "webhook", "trigger": "push", "delivery": "d-1", "event": "push"}
    seen = GrapheneClient(web.url, token=factories.api_token(user), ca_file=web.ca_file).runs.get(str(run.pk))
    assert seen.cause["delivery"] == "d-1"
    assert seen.cause_text == "webhook push delivery d-1 (trigger push)"
    again = http.request("POST", f"{web.url}/hooks/t-deploy/push", body=body, headers=headers)
    assert again.status == 200
    assert json.loads(again.data) | {"status": "started"} == answer | {"replayed": True}
    assert len(runs_of("t-deploy")) == 1, "a delivery id seen before starts nothing"


def test_a_wrong_or_missing_signature_is_a_401_that_leaves_only_an_event(hooked: Trigger) -> None:
    client = Client()
    body = b'{"ref": "refs/heads/main"}'
    wrong = deliver(client, body, delivery="d-2", signature=signed(body, "not-the-secret"))
    assert wrong.status_code == 401
    assert wrong.json()["detail"] == "signature refused: wrong signature"
    tampered = deliver(client, body + b" ", delivery="d-3", signature=signed(body))
    assert tampered.status_code == 401
    missing = deliver(client, body, delivery="d-4", signature=None)
    assert missing.status_code == 401
    assert "no X-Hub-Signature-256" in missing.json()["detail"]
    bad_bearer = deliver(client, body, delivery="d-5", signature=None, HTTP_AUTHORIZATION="Bearer nope")
    assert bad_bearer.status_code == 401
    assert not Run.objects.exists()
    assert not TriggerFiring.objects.exists()
    assert list(hooked.events.values_list("reason", flat=True)) == ["SignatureRefused"] * 4


def test_deliveries_answer_precisely(hooked: Trigger, workers: Any) -> None:
    client = Client()
    body = b'{"ref": "refs/tags/v1"}'
    ping = deliver(client, body, delivery="p-1", signature=signed(body), HTTP_X_GITHUB_EVENT="ping")
    assert ping.status_code == 200
    assert ping.json() == {"pong": True}
    other = deliver(client, body, delivery="o-1", signature=signed(body), HTTP_X_GITHUB_EVENT="issues")
    assert other.status_code == 202
    assert "'issues' is not 'push'" in other.json()["detail"]
    no_id = deliver(client, body, delivery="", signature=signed(body))
    assert no_id.status_code == 400
    assert "X-GitHub-Delivery" in no_id.json()["detail"]
    not_json = deliver(client, b"ref=main", delivery="n-1", signature=signed(b"ref=main"))
    assert not_json.status_code == 400
    assert "not JSON" in not_json.json()["detail"]
    unknown = client.post("/hooks/t-deploy/nope", body, content_type="application/json")
    assert unknown.status_code == 404
    assert "no webhook trigger 'nope'" in unknown.json()["detail"]
    with override_settings(GRAPHENE_WEBHOOK_MAX_BYTES=64):
        big = b'{"ref": "' + b"x" * 100 + b'"}'
        too_big = deliver(client, big, delivery="b-1", signature=signed(big))
        assert too_big.status_code == 413
        assert "GRAPHENE_WEBHOOK_MAX_BYTES" in too_big.json()["detail"]
    bearer = deliver(client, body, delivery="ok-1", signature=None, HTTP_AUTHORIZATION=f"Bearer {HOOK_SECRET}")
    assert bearer.status_code == 201, bearer.content
    assert ended(bearer.json()["run"]).outputs == {"version": "refs/tags/v1"}
    assert Run.objects.count() == 1
    Trigger.objects.filter(pk=hooked.pk).update(paused=True)
    paused = deliver(client, body, delivery="ok-2", signature=signed(body))
    assert paused.status_code == 202
    assert paused.json()["status"] == "skipped"
    assert Run.objects.count() == 1
    reasons = list(hooked.events.values_list("reason", flat=True))
    assert reasons == ["Ping", "Ignored", "BodyRefused", "Fired", "Skipped"]


def test_a_triggered_start_meets_the_concurrency_policy(api: APIClient, tmp_path: Path, user: Any) -> None:
    secrets.secret_create(name="HOOK", value=HOOK_SECRET, actor=user)
    code = """
    class In(BaseModel):
        event: dict[str, Any] = {}

    @pipeline("t-deploy", inputs=In, concurrency="queue", max_pending=0, triggers=[webhook("push", secret="HOOK")])
    def one_at_a_time(ctx: Context, inputs: In) -> None:
        pass
    """
    pushed(api, tmp_path, code)
    client = Client()
    body = b"{}"
    first = deliver(client, body, delivery="q-1", signature=signed(body))
    assert first.status_code == 201  # no workers: it stays queued, holding the turn
    second = deliver(client, body, delivery="q-2", signature=signed(body))
    assert second.status_code == 422
    assert "max_pending=0" in second.json()["detail"]
    assert Run.objects.count() == 1
    refused = TriggerEvent.objects.get(reason="StartRefused")
    assert "delivery q-2" in refused.message
    assert "max_pending=0" in refused.message


# --- cron, with real beat processes -------------------------------------------------------------------

EVERY_SECOND = """
class In(BaseModel):
    label: str = ""


@pipeline("t-tick", inputs=In, triggers=[cron("* * * * * *", inputs={{"label": "tick"}}, missed="{missed}")])
def tick(ctx: Context, inputs: In) -> str:
    return inputs.label
"""


def beat_dir(base: Path, name: str) -> Path:
    (base / name).mkdir()
    return base / name


def instants() -> list[str]:
    return [r.cause["instant"] for r in Run.objects.filter(pipeline__name="t-tick").order_by("created_at")]


def assert_once_each(seen: list[str]) -> None:
    assert len(seen) == len(set(seen)), f"an instant started two runs: {seen}"


def test_cron_fires_once_per_instant_with_two_beats_and_across_a_restart(
    api: APIClient, tmp_path: Path, workers: Any
) -> None:
    pushed(api, tmp_path, EVERY_SECOND.format(missed="skip"))
    with running_beat(beat_dir(tmp_path, "one")), running_beat(beat_dir(tmp_path, "two")):
        wait_for(lambda: len(instants()) >= 4, timeout=30, what="four instants fired with two beats running")
    assert_once_each(instants())
    before = len(instants())
    with running_beat(beat_dir(tmp_path, "again")):  # restarted at once: nothing missed, nothing twice
        wait_for(lambda: len(instants()) >= before + 3, timeout=30, what="instants fired after the restart")
    seen = instants()
    assert_once_each(seen)
    # Every second from the first fire on either fired once or is in a range the trigger says it
    # skipped (a restart slower than GRAPHENE_CRON_MISSED_AFTER_SECONDS): none lost unexplained.
    stamps = {datetime.fromisoformat(s) for s in seen}
    skipped = [
        (datetime.fromisoformat(e.data["first"]), datetime.fromisoformat(e.data["latest"]))
        for e in TriggerEvent.objects.filter(reason="MissedSkipped")
    ]
    second, last = min(stamps), max(stamps)
    while second <= last:
        assert second in stamps or any(a <= second <= b for a, b in skipped), f"{second} neither fired nor skipped"
        second += timedelta(seconds=1)
    run = Run.objects.filter(pipeline__name="t-tick").order_by("created_at").first()
    assert run is not None
    assert run.inputs == {"label": "tick"}
    assert ended(run.pk).outputs == "tick"
    assert run.cause["schedule"] == "* * * * * *"
    assert run.cause["trigger"] == "cron"
    # Each run is one firing's (instants scheduled before the beats stopped may still fire now).
    fired = list(TriggerEvent.objects.filter(reason="Fired").values_list("run_id", flat=True))
    assert len(fired) == len(set(fired))
    assert set(Run.objects.filter(cause__instant__in=seen).values_list("pk", flat=True)) <= set(fired)


@pytest.mark.parametrize("policy", ["skip", "latest"])
def test_instants_missed_while_beat_was_down_follow_the_policy(
    api: APIClient, tmp_path: Path, workers: Any, policy: str
) -> None:
    pushed(api, tmp_path, EVERY_SECOND.format(missed=policy))
    trigger = Trigger.objects.get(name="cron")
    with running_beat(beat_dir(tmp_path, "first")):
        wait_for(lambda: len(instants()) >= 1, timeout=30, what="a first instant")
    # (a first instant may have been missed already, by a scheduler slow to start: not this one)
    mark = trigger.events.order_by("-id").values_list("id", flat=True).first() or 0
    before = len(instants())

    def overdue() -> float:
        due = Trigger.objects.get(pk=trigger.pk).next_fire_at
        assert due is not None
        return (timezone.now() - due).total_seconds()

    # Down until the next instant is later than GRAPHENE_CRON_MISSED_AFTER_SECONDS (3 s in tests).
    wait_for(lambda: overdue() > 4, timeout=15, what="the next instant to be missed")
    with running_beat(beat_dir(tmp_path, "second")):
        reason = "MissedSkipped" if policy == "skip" else "MissedFiredLatest"
        wait_for(
            lambda: trigger.events.filter(reason=reason, id__gt=mark).exists(), timeout=30, what=f"a {reason} event"
        )
        wait_for(lambda: len(instants()) >= before + 2, timeout=30, what="instants after the outage")
    event = trigger.events.filter(reason=reason, id__gt=mark).order_by("id").first()
    assert event is not None
    assert event.data["count"] >= 3, event.data
    seen = instants()
    assert_once_each(seen)
    after = [datetime.fromisoformat(s) for s in seen[before:]]
    missed_first, missed_latest = (datetime.fromisoformat(event.data[k]) for k in ("first", "latest"))
    in_outage = [s for s in after if missed_first <= s <= missed_latest]
    assert in_outage == ([] if policy == "skip" else [missed_latest]), (policy, seen, event.data)


def test_triggers_of_code_installed_on_the_workers_are_reconciled_when_it_is_synced() -> None:
    from graphene_sdk import Pipeline as Definition
    from graphene_sdk import cron, upstream
    from pydantic import BaseModel

    class In(BaseModel):
        pass

    def flow(ctx: Any, inputs: In) -> None:
        pass

    def installed(*declared: Any) -> Definition[Any, Any]:
        return Definition(name="t-installed", fn=flow, inputs=In, output=None, triggers=declared)

    row = services.pipeline_sync(installed(cron("0 3 * * *", name="nightly")))
    trigger = Trigger.objects.get(pipeline=row)
    assert trigger.name == "nightly"
    assert trigger.next_fire_at is not None
    services.pipeline_sync(installed(cron("0 3 * * *", name="nightly")))
    assert Trigger.objects.get(pipeline=row).pk == trigger.pk, "unchanged code changes nothing"
    with pytest.raises(triggers.TriggersRefused, match="t-installed → t-installed"):
        services.pipeline_sync(installed(upstream("t-installed")))
    assert Trigger.objects.get(pipeline=row).pk == trigger.pk, "refused code left the triggers as they were"
    assert Pipeline.objects.get(pk=row.pk).trigger_specs == [trigger.spec]
    services.pipeline_sync(installed())
    assert not Trigger.objects.filter(pipeline=row).exists()
    services.pipeline_sync(installed(cron("0 3 * * *", name="nightly")))
    assert Trigger.objects.filter(pipeline=row).exists()
    # An end of the pipeline it watches fires it: a pipeline of installed code has no revision.
    services.pipeline_sync(installed(upstream("t-watched", on="any")))
    watched = Pipeline.objects.create(name="t-watched", source="tests:watched")
    ended_run = Run.objects.create(pipeline=watched, number=1, status="failed", inputs={"a": 1})
    fired: list[TriggerFiring] = []
    triggers.upstream_ended(ended_run, fired)
    with CaptureQueriesContext(connection) as reads:
        found = [(f.trigger.name, f.trigger.pipeline.name, f.trigger.pipeline.revision, f.payload) for f in fired]
    payload = {"id": str(ended_run.pk), "pipeline": "t-watched", "number": 1, "status": "failed"}
    assert found == [("after-t-watched", "t-installed", None, {**payload, "inputs": {"a": 1}, "outputs": None})]
    assert fired[0].cause["status"] == "failed"
    assert len(reads) == 0, [q["sql"] for q in reads.captured_queries]
    services.pipelines_sync_all()  # its code is not installed (any more): its triggers go
    assert not Trigger.objects.filter(pipeline=row).exists()
    assert PipelineEvent.objects.filter(pipeline=row).values_list("reason", flat=True)[::1] == [
        "TriggerCreated",
        "TriggerDeleted",
        "TriggerCreated",
        "TriggerDeleted",
        "TriggerCreated",
        "TriggerDeleted",
    ]
