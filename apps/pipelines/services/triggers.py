"""Triggers: reconciling them with the code that declares them, firing them, pausing them.

A trigger fires by writing a ``TriggerFiring`` (unique per trigger and cause: an upstream run's
id, a cron instant, a webhook delivery id) in the transaction that saw the cause; the run
starts from the firing, with an idempotency key derived from it, so a cause starts at most one
run. A firing whose process died before starting its run is started by the scheduler's tick
(``triggers_tick``) a few seconds later.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import traceback
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.utils import timezone
from graphene_sdk._triggers import UpstreamRun

from apps.core import access, audit
from apps.core.db import is_postgresql, models_from_row, prepared_cursor, select_columns
from apps.core.errors import Conflict, GrapheneError, NotFound, ValidationFailed
from apps.pipelines.choices import UPSTREAM_OUTCOMES, FiringStatus, TriggerType
from apps.pipelines.models import Pipeline, PipelineEvent, Revision, Run, Trigger, TriggerEvent, TriggerFiring

logger = logging.getLogger(__name__)

TRACEBACK_CHARS = 3000
# Missed cron instants are counted up to this many (a long outage of a per-second schedule).
MISSED_COUNT_MAX = 10_000


class TriggersRefused(ValidationFailed):
    """Triggers that cannot be made as declared (a cron expression, a timezone, a cycle ...)."""

    code = "triggers_refused"


# --- checking what the code declares -------------------------------------------------------------


def _cron_iter(spec: Mapping[str, Any], start: datetime) -> croniter:
    zone = ZoneInfo(str(spec.get("timezone") or "UTC"))
    return croniter(str(spec["schedule"]), start.astimezone(zone))


def cron_next(spec: Mapping[str, Any], after: datetime) -> datetime:
    """The schedule's first instant strictly after ``after``, in UTC."""
    nxt: datetime = _cron_iter(spec, after).get_next(datetime)
    return nxt.astimezone(UTC)


def specs_check(pipeline: str, specs: Any, input_schema: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The trigger specs of one pipeline as the server keeps them; ``TriggersRefused`` naming
    the pipeline and trigger when one cannot work."""
    if not isinstance(specs, list):
        raise TriggersRefused(f"pipeline {pipeline!r}: triggers must be a list")
    checked, names = [], set()
    for spec in specs:
        if not isinstance(spec, dict) or spec.get("type") not in TriggerType.values:
            raise TriggersRefused(
                f"pipeline {pipeline!r}: {spec!r} is not a trigger "
                "(code described before triggers existed: push it again)"
            )
        name = str(spec.get("name") or "")
        where = f"pipeline {pipeline!r}, trigger {name!r}"
        if not name or name in names:
            raise TriggersRefused(f"{where}: each trigger needs a name of its own in the pipeline")
        names.add(name)
        if spec["type"] == TriggerType.CRON:
            try:
                ZoneInfo(str(spec.get("timezone") or "UTC"))
            except (ZoneInfoNotFoundError, ValueError):
                raise TriggersRefused(
                    f"{where}: unknown timezone {spec.get('timezone')!r}: "
                    "use an IANA name such as 'Europe/Berlin' or 'UTC'"
                ) from None
            if not croniter.is_valid(str(spec.get("schedule", ""))):
                raise TriggersRefused(
                    f"{where}: {spec.get('schedule')!r} is not a cron expression: five fields "
                    "(minute hour day-of-month month day-of-week), or six with seconds last"
                )
            try:
                cron_next(spec, timezone.now())
            except (CroniterError, ValueError) as exc:
                raise TriggersRefused(f"{where}: {spec.get('schedule')!r} never comes: {exc}") from None
        if spec["type"] == TriggerType.WEBHOOK and "event" not in (input_schema or {}).get("properties", {}):
            raise TriggersRefused(
                f"{where}: a webhook's body arrives as the reserved input 'event': declare it in the pipeline's "
                "input model (event: dict[str, Any], or a model of the payload)"
            )
        checked.append(dict(spec))
    return checked


def _cycle(edges: Mapping[str, set[str]]) -> list[str] | None:
    """A cycle in ``upstream -> downstreams`` as the names along it (first repeated at the end)."""
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt, path)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node, [])) is not None:
            return found
    return None


def cycle_check(declared: Mapping[str, list[dict[str, Any]]]) -> None:
    """Refuse upstream triggers that would form a cycle (A's end starts B, B's end starts A):
    ``declared`` replaces the named pipelines' triggers in the installation's graph."""
    edges: dict[str, set[str]] = defaultdict(set)
    existing = Trigger.objects.filter(type=TriggerType.UPSTREAM).exclude(pipeline__name__in=list(declared))
    for downstream, upstream in existing.values_list("pipeline__name", "upstream"):
        edges[upstream].add(downstream)
    for downstream, specs in declared.items():
        for spec in specs:
            if spec["type"] == TriggerType.UPSTREAM:
                edges[str(spec["pipeline"])].add(downstream)
    found = _cycle(edges)
    if found is not None:
        raise TriggersRefused(
            "upstream triggers would form a cycle, each run starting the next for ever: "
            + " → ".join(found)
            + "; remove one of these upstream(...) triggers"
        )


# --- reconciling --------------------------------------------------------------------------------


def trigger_summary(spec: Mapping[str, Any]) -> str:
    """A trigger in one line: ``cron */15 * * * * (UTC, missed: skip)``."""
    if spec["type"] == TriggerType.UPSTREAM:
        return f"upstream {spec['pipeline']} on {spec.get('on', 'succeeded')}"
    if spec["type"] == TriggerType.CRON:
        return f"cron {spec['schedule']} ({spec.get('timezone') or 'UTC'}, missed: {spec.get('missed', 'skip')})"
    return f"webhook {spec['event']} (secret {spec.get('secret')})"


def triggers_reconcile(
    row: Pipeline, specs: list[dict[str, Any]], *, actor: Any = None, now: datetime | None = None
) -> list[PipelineEvent]:
    """Make the pipeline's triggers those of ``specs`` (in the caller's transaction): new ones
    created, vanished ones deleted, changed ones replaced (a paused one stays paused). Returns
    the pipeline's events to write, one per change."""
    now = now or timezone.now()
    who = actor if actor is not None and getattr(actor, "is_authenticated", False) else None
    existing = {t.name: t for t in Trigger.objects.filter(pipeline=row)}
    wanted = {spec["name"]: spec for spec in specs}
    events: list[PipelineEvent] = []
    for name, old in existing.items():
        if name not in wanted:
            old.delete()
            events.append(
                PipelineEvent(
                    pipeline=row,
                    reason="TriggerDeleted",
                    message=f"trigger {name}: {trigger_summary(old.spec)}",
                    data={"trigger": name, "spec": old.spec},
                    actor=who,
                )
            )
    for name, spec in wanted.items():
        previous = existing.get(name)
        if previous is not None and previous.spec == spec:
            continue
        if previous is not None:
            previous.delete()
        Trigger.objects.create(
            pipeline=row,
            namespace=row.namespace,
            name=name,
            type=spec["type"],
            spec=spec,
            upstream=str(spec.get("pipeline", "")) if spec["type"] == TriggerType.UPSTREAM else "",
            next_fire_at=cron_next(spec, now) if spec["type"] == TriggerType.CRON else None,
            paused=previous.paused if previous is not None else False,
            paused_by=previous.paused_by if previous is not None else None,
            paused_at=previous.paused_at if previous is not None else None,
        )
        message = f"trigger {name}: {trigger_summary(spec)}"
        if previous is not None and previous.paused:
            message += " (still paused)"
        events.append(
            PipelineEvent(
                pipeline=row,
                reason="TriggerReplaced" if previous is not None else "TriggerCreated",
                message=message,
                data={"trigger": name, "spec": spec, **({"was": previous.spec} if previous is not None else {})},
                actor=who,
            )
        )
    return events


# --- firing -------------------------------------------------------------------------------------


def _event(
    trigger: Trigger, reason: str, message: str, *, run: Run | None = None, actor: Any = None, **data: object
) -> TriggerEvent:
    who = actor if actor is not None and getattr(actor, "is_authenticated", False) else None
    return TriggerEvent.objects.create(trigger=trigger, reason=reason, message=message, data=data, run=run, actor=who)


def firings_on_commit() -> list[TriggerFiring]:
    """A list for the ids of the firings this transaction writes: once it commits, their runs
    are started here and now (no hop through the broker), before whatever the transaction
    asks for after this call (hooks run in the order they were registered). One that fails
    here goes to a worker; one whose process dies first is started by the tick
    (``GRAPHENE_FIRING_RETRY_SECONDS``)."""
    firings: list[TriggerFiring] = []

    def process() -> None:
        from apps.pipelines.tasks import trigger_firing_task

        for firing in firings:
            try:
                firing_process(firing)
            except Exception:
                logger.exception("firing %s: starting its run here failed; a worker tries again", firing.pk)
                trigger_firing_task.delay(firing.pk)

    transaction.on_commit(process, robust=True)
    return firings


def upstream_ended(run: Run, firings: list[TriggerFiring] | None = None) -> None:
    """A run ended (in the caller's transaction): the upstream triggers watching its pipeline
    fire, each once for this run. Child runs fire nothing (their parent run answers for them).
    ``firings``: a list from ``firings_on_commit`` taken earlier in the transaction (else one
    is taken now)."""
    if run.parent_run_id is not None:
        return
    fired = firings if firings is not None else firings_on_commit()
    payload = {
        "id": str(run.pk),
        "pipeline": run.pipeline.name,
        "number": run.number,
        "status": run.status,
        "inputs": run.inputs,
        "outputs": run.outputs,
    }
    cause = {
        "type": "upstream",
        "run": str(run.pk),
        "name": f"{run.pipeline.name}#{run.number}",
        "status": run.status,
    }
    if is_postgresql():
        fired.extend(_upstream_fire(run, cause, payload))
        return
    triggers = Trigger.objects.filter(type=TriggerType.UPSTREAM, upstream=run.pipeline.name, namespace=run.namespace)
    firing_rows = [
        TriggerFiring(trigger=trigger, key=str(run.pk), cause={**cause, "trigger": trigger.name}, payload=payload)
        for trigger in triggers.select_related("pipeline")
        if run.status in UPSTREAM_OUTCOMES[trigger.spec.get("on", "succeeded")]
    ]
    if firing_rows:
        # One statement; a firing of this end seen before (a replayed finish) is left as it is
        # (the no-op update only returns its id, and processing it again changes nothing).
        TriggerFiring.objects.bulk_create(
            firing_rows, update_conflicts=True, unique_fields=["trigger", "key"], update_fields=["key"]
        )
        fired.extend(firing_rows)


def _upstream_fire(run: Run, cause: Mapping[str, Any], payload: Mapping[str, Any]) -> list[TriggerFiring]:
    """PostgreSQL: the watching triggers found and their firings written in one prepared
    statement (every run's end waits for it; the two querysets compiled slower than they ran).
    Returns the firings with their triggers, pipelines and active revisions loaded, as
    ``firing_process`` and the start take them; a firing of this end seen before (a replayed
    finish) is returned as it stands."""
    ons = sorted(on for on, outcomes in UPSTREAM_OUTCOMES.items() if run.status in outcomes)
    with prepared_cursor() as cursor:
        cursor.execute(
            _upstream_fire_sql(),
            [
                run.pipeline.name,
                run.namespace,
                ons,
                str(run.pk),
                json.dumps(cause, cls=DjangoJSONEncoder),
                json.dumps(payload, cls=DjangoJSONEncoder),
                timezone.now(),
            ],
        )
        rows = cursor.fetchall()
    found = []
    for row in rows:
        firing, trigger, pipeline, revision = models_from_row((TriggerFiring, Trigger, Pipeline, Revision), row)
        pipeline.revision = revision
        trigger.pipeline = pipeline
        firing.trigger = trigger
        found.append(firing)
    return found


@functools.cache
def _upstream_fire_sql() -> str:
    # jsonb_build_object: the trigger's name joins the cause as the ORM path writes it.
    def renamed(model: type[Any], prefix: str) -> str:
        return ", ".join(f"t.{prefix}{f.column}" for f in model._meta.concrete_fields)

    return f"""
WITH t AS (
    SELECT {select_columns(Trigger, "tr", prefix="t_")}, {select_columns(Pipeline, "p", prefix="p_")},
        {select_columns(Revision, "r", prefix="r_")}
    FROM pipelines_trigger tr JOIN pipelines_pipeline p ON p.id = tr.pipeline_id
        LEFT JOIN pipelines_revision r ON r.id = p.revision_id
    WHERE tr.type = 'upstream' AND tr.upstream = %s AND tr.namespace = %s
      AND COALESCE(tr.spec ->> 'on', 'succeeded') = ANY(%s)
), f AS (
    INSERT INTO pipelines_triggerfiring (trigger_id, key, cause, payload, status, error, created_at)
    SELECT t.t_id, %s, %s::jsonb || jsonb_build_object('trigger', t.t_name), %s::jsonb, 'pending', '', %s
    FROM t
    ON CONFLICT (trigger_id, key) DO UPDATE SET key = EXCLUDED.key
    RETURNING {select_columns(TriggerFiring, "pipelines_triggerfiring")}
)
SELECT f.*, {renamed(Trigger, "t_")}, {renamed(Pipeline, "p_")}, {renamed(Revision, "r_")}
FROM f JOIN t ON t.t_id = f.trigger_id ORDER BY t.t_name"""  # noqa: S608 - names from the models


def _declared(trigger: Trigger) -> Any:
    """The trigger as the pipeline's code declares it now (its ``inputs`` callable)."""
    from apps.pipelines.services.definitions import definition_get

    definition = definition_get(trigger.pipeline.name, row=trigger.pipeline)
    for declared in definition.triggers:
        if declared.name == trigger.name:
            return declared
    raise NotFound(f"trigger {trigger.name!r} is no longer declared by pipeline {trigger.pipeline.name!r}'s code")


def _as_inputs(value: Any, what: str) -> dict[str, Any]:
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    if not isinstance(value, Mapping):
        raise ValidationFailed(f"{what} returned {type(value).__name__}, not a dict of the run's inputs")
    return dict(value)


def _inputs_for(trigger: Trigger, firing: TriggerFiring) -> dict[str, Any]:
    """The new run's inputs: a cron trigger's own, or what its ``inputs`` callable makes of the
    upstream run or the webhook's body (which also arrives as ``event``)."""
    if trigger.type == TriggerType.CRON:
        return dict(trigger.spec.get("inputs") or {})
    fn = _declared(trigger).inputs if trigger.spec.get("inputs") else None
    what = f"trigger {trigger}: inputs({trigger.spec.get('inputs')})"
    if trigger.type == TriggerType.UPSTREAM:
        return _as_inputs(fn(UpstreamRun(**(firing.payload or {}))), what) if fn is not None else {}
    inputs = _as_inputs(fn(firing.payload), what) if fn is not None else {}
    return {**inputs, "event": firing.payload}


def firing_process(firing_or_id: TriggerFiring | int) -> TriggerFiring | None:
    """Start the run of a pending firing, or record why not: the trigger is paused (skipped),
    or the start was refused (failed, with the reason). Once, whoever calls and however often:
    the run's idempotency key is the firing's (a second start returns the first's run), and
    only the call that moves the firing out of ``pending`` writes the trigger's event. Given
    the firing itself (as its transaction wrote it, its trigger and pipeline loaded), it is
    not read again."""
    from apps.pipelines.services.starts import run_start

    if isinstance(firing_or_id, TriggerFiring):
        firing: TriggerFiring | None = firing_or_id
    else:
        firing = TriggerFiring.objects.select_related("trigger__pipeline__revision").filter(pk=firing_or_id).first()
    if firing is None or firing.status != FiringStatus.PENDING:
        return firing
    trigger = firing.trigger
    what = _cause_words(firing.cause)
    pending = TriggerFiring.objects.filter(pk=firing.pk, status=FiringStatus.PENDING)
    if trigger.paused:
        with transaction.atomic():
            if pending.update(status=FiringStatus.SKIPPED, error="the trigger is paused", done_at=timezone.now()):
                _event(trigger, "Skipped", f"paused: did not start a run for {what}", cause=firing.cause)
        return TriggerFiring.objects.filter(pk=firing.pk).first()
    inputs: dict[str, Any] | None = None
    problem = ""
    try:  # the pipeline's own code (an inputs callable): outside the transaction
        inputs = _inputs_for(trigger, firing)
    except GrapheneError as exc:
        problem = str(exc.detail)
    except Exception as exc:
        trace = "".join(traceback.format_exception(exc))[-TRACEBACK_CHARS:]
        problem = f"its inputs function raised {type(exc).__name__}: {exc}\n{trace}"
    run = None
    if inputs is not None:
        try:  # committed on its own, so that its worker starts it at once (the key keeps it one run)
            run = run_start(
                pipeline_name=trigger.pipeline.name,
                inputs=inputs,
                idempotency_key=f"trigger:{trigger.pk}:{firing.key}"[:255],
                cause=firing.cause,
                trigger=trigger,
            )
        except GrapheneError as exc:
            problem = str(exc.detail)
    # The bookkeeping after: a process that dies in between leaves the firing pending, and the
    # tick's second try finds the run by its key (the start is replayed, not repeated).
    now = timezone.now()
    status = FiringStatus.STARTED if run is not None else FiringStatus.FAILED
    if run is not None and is_postgresql():
        ended = _fired(firing, run, f"started {run} for {what}", now)
    else:
        with transaction.atomic():
            ended = bool(pending.update(status=status, run=run, error=problem, done_at=now))
            if ended and run is None:
                _event(trigger, "StartRefused", f"no run for {what}: {problem}", cause=firing.cause)
                logger.warning("trigger %s: no run for %s: %s", trigger, what, problem)
            elif ended:
                Trigger.objects.filter(pk=trigger.pk).update(last_fired_at=now, last_run=run)
                _event(trigger, "Fired", f"started {run} for {what}", run=run, cause=firing.cause)
    if not ended:
        return TriggerFiring.objects.filter(pk=firing.pk).first()  # another call ended it
    firing.status, firing.run, firing.error, firing.done_at = status, run, problem, now
    return firing


def _fired(firing: TriggerFiring, run: Run, message: str, now: datetime) -> bool:
    """PostgreSQL: a pending firing started ``run``: the firing, its trigger's last run and the
    ``Fired`` event in one prepared statement (its worker runs it beside the new run's
    execution). False when another call had ended the firing (nothing written)."""
    with prepared_cursor() as cursor:
        cursor.execute(
            _FIRED,
            {
                "firing": firing.pk,
                "trigger": firing.trigger_id,
                "run": run.pk,
                "now": now,
                "message": message,
                "data": json.dumps({"cause": firing.cause}, cls=DjangoJSONEncoder),
            },
        )
        return bool(cursor.fetchone()[0])


_FIRED = """
WITH f AS (
    UPDATE pipelines_triggerfiring SET status = 'started', run_id = %(run)s, error = '', done_at = %(now)s
    WHERE id = %(firing)s AND status = 'pending' RETURNING id
), t AS (
    UPDATE pipelines_trigger SET last_fired_at = %(now)s, last_run_id = %(run)s
    WHERE id = %(trigger)s AND EXISTS (SELECT 1 FROM f)
), e AS (
    INSERT INTO pipelines_triggerevent (trigger_id, reason, message, data, run_id, created_at)
    SELECT %(trigger)s, 'Fired', %(message)s, %(data)s::jsonb, %(run)s, %(now)s FROM f
)
SELECT count(*) FROM f"""


def _cause_words(cause: Mapping[str, Any]) -> str:
    from apps.pipelines.causes import cause_text

    return cause_text(dict(cause))


# --- cron ---------------------------------------------------------------------------------------


def _missed_instants(spec: Mapping[str, Any], first: datetime, now: datetime) -> tuple[int, datetime]:
    """How many instants from ``first`` up to ``now`` passed (at most ``MISSED_COUNT_MAX``
    counted), and the latest of them."""
    it = _cron_iter(spec, first - timedelta(microseconds=1))
    count, latest = 0, first
    while count < MISSED_COUNT_MAX:
        instant: datetime = it.get_next(datetime).astimezone(UTC)
        if instant > now:
            break
        count, latest = count + 1, instant
    if count >= MISSED_COUNT_MAX:  # counted enough: the latest is the last instant before now
        latest = (
            croniter(str(spec["schedule"]), now.astimezone(ZoneInfo(str(spec.get("timezone") or "UTC"))))
            .get_prev(datetime)
            .astimezone(UTC)
        )
    return count, latest


def cron_fire(trigger_id: Any) -> int | None:
    """Fire the cron trigger if its instant came: once per instant, whoever calls (two
    schedulers, a tick and an exact-time task). An instant later than
    ``GRAPHENE_CRON_MISSED_AFTER_SECONDS`` was missed (the scheduler was down): by the
    trigger's ``missed`` policy the missed instants are skipped, or the latest fires once; each
    decision is an event. Returns the firing's id, if one was written."""
    firing_id = None
    with transaction.atomic():
        trigger = (
            Trigger.objects.select_for_update(skip_locked=True)
            .select_related("pipeline")
            .filter(pk=trigger_id, type=TriggerType.CRON)
            .first()
        )
        now = timezone.now()
        if trigger is None or trigger.next_fire_at is None or trigger.next_fire_at > now:
            return None
        spec, instant = trigger.spec, trigger.next_fire_at
        fire_at: datetime | None = instant
        if (now - instant).total_seconds() > settings.GRAPHENE_CRON_MISSED_AFTER_SECONDS:
            count, latest = _missed_instants(spec, instant, now)
            more = "+" if count >= MISSED_COUNT_MAX else ""
            first, last = instant.isoformat(), latest.isoformat()
            missed = f"{count}{more} instant(s) missed from {first} to {last}"
            if spec.get("missed") == "latest":
                fire_at = latest
                _event(
                    trigger,
                    "MissedFiredLatest",
                    f"{missed}: the latest fires once",
                    count=count,
                    first=first,
                    latest=last,
                )
            else:
                fire_at = None
                _event(
                    trigger,
                    "MissedSkipped",
                    f"{missed}: skipped (missed='skip')",
                    count=count,
                    first=first,
                    latest=last,
                )
            trigger.next_fire_at = cron_next(spec, now)
        else:
            trigger.next_fire_at = cron_next(spec, instant)
        trigger.save(update_fields=["next_fire_at", "updated_at"])
        if fire_at is not None:
            cause = {
                "type": "cron",
                "trigger": trigger.name,
                "instant": fire_at.isoformat(),
                "schedule": spec["schedule"],
            }
            try:
                with transaction.atomic():
                    firing = TriggerFiring.objects.create(trigger=trigger, key=fire_at.isoformat(), cause=cause)
            except IntegrityError:  # this instant fired already (its next instant was reset since)
                firing = None
            if firing is not None:
                firing_id = firing.pk
    if firing_id is not None:
        firing_process(firing_id)
    return firing_id


# A tick asks for at most this many instants of one trigger (a per-second schedule: two or three).
TICK_INSTANTS_MAX = 10


def triggers_tick() -> dict[str, int]:
    """The scheduler's tick (every ``GRAPHENE_TRIGGERS_TICK_SECONDS``): each cron instant from a
    trigger's next one up to the tick after next is handed to a worker to fire at its exact
    time (at once if it came already) — every one of them, so an instant fired late is followed
    by the next on time, and many triggers due together fire in parallel. Then the firings
    whose process died before it started their run are started."""
    from apps.pipelines.tasks import trigger_cron_fire_task

    now = timezone.now()
    horizon = now + timedelta(seconds=float(settings.GRAPHENE_TRIGGERS_TICK_SECONDS) * 1.5)
    due = Trigger.objects.filter(type=TriggerType.CRON, next_fire_at__lte=horizon)
    scheduled = 0
    for trigger_id, at, spec in due.values_list("pk", "next_fire_at", "spec"):
        for _ in range(TICK_INSTANTS_MAX):
            if at is None or at > horizon:
                break
            trigger_cron_fire_task.apply_async((str(trigger_id),), eta=max(at, now))
            scheduled += 1
            at = cron_next(spec, at)
    stale = now - timedelta(seconds=settings.GRAPHENE_FIRING_RETRY_SECONDS)
    pending = list(
        TriggerFiring.objects.filter(status=FiringStatus.PENDING, created_at__lt=stale)
        .order_by("created_at")
        .values_list("pk", flat=True)[:100]
    )
    for firing_id in pending:
        firing_process(firing_id)
    return {"scheduled": scheduled, "recovered": len(pending)}


# --- webhooks -----------------------------------------------------------------------------------

DELIVERY_HEADERS = ("X-GitHub-Delivery", "X-Gitea-Delivery", "X-Gitlab-Event-UUID", "X-Graphene-Delivery")
EVENT_HEADERS = ("X-GitHub-Event", "X-Gitea-Event", "X-Graphene-Event")


@dataclass
class HookAnswer:
    status: int
    body: dict[str, Any]


def _signature_ok(secret: str, body: bytes, headers: Mapping[str, str]) -> str | None:
    """None when the delivery is signed with ``secret``; else why not (for the trigger's event)."""
    signature = headers.get("X-Hub-Signature-256", "")
    if signature:
        expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        return None if hmac.compare_digest(signature.strip().encode(), expected.encode()) else "wrong signature"
    bearer = headers.get("Authorization", "")
    if bearer:
        scheme, _, token = bearer.partition(" ")
        if scheme.lower() != "bearer":
            return "the Authorization header is not a bearer secret"
        return None if hmac.compare_digest(token.strip().encode(), secret.encode()) else "wrong bearer secret"
    return "no X-Hub-Signature-256 or Authorization header"


def _body_parse(body: bytes, content_type: str) -> Any:
    """A delivery's JSON, sent as ``application/json`` or GitHub's form encoding (``payload=``)."""
    from urllib.parse import parse_qs

    if content_type.split(";")[0].strip().lower() == "application/x-www-form-urlencoded":
        form = parse_qs(body.decode("utf-8"), strict_parsing=False)
        if "payload" not in form:
            raise ValueError("a form-encoded delivery carries its JSON in the 'payload' field")
        return json.loads(form["payload"][0])
    return json.loads(body.decode("utf-8"))


def webhook_receive(
    *, pipeline: str, name: str, body: bytes, headers: Mapping[str, str], remote: str = ""
) -> HookAnswer:
    """A delivery to ``/hooks/{pipeline}/{name}``: checked against the trigger's secret in
    constant time over the raw body, refused (401, and an event on the trigger, never a run)
    when unsigned or wrongly signed; a delivery id seen before answers with its first outcome."""
    from apps.secrets import services as secrets

    trigger = (
        Trigger.objects.select_related("pipeline")
        .filter(pipeline__name=pipeline, name=name, type=TriggerType.WEBHOOK)
        .first()
    )
    if trigger is None:
        return HookAnswer(404, {"detail": f"pipeline {pipeline!r} has no webhook trigger {name!r}"})
    try:
        secret = secrets.secret_resolve(name=trigger.spec["secret"], namespace=trigger.namespace)
    except GrapheneError:
        _event(
            trigger,
            "SecretMissing",
            f"delivery refused: no secret {trigger.spec['secret']!r} in namespace {trigger.namespace!r}",
            remote=remote,
        )
        return HookAnswer(
            503, {"detail": "the trigger cannot check signatures: its secret is missing (see the trigger's events)"}
        )
    wrong = _signature_ok(secret, body, headers)
    if wrong is not None:
        _event(trigger, "SignatureRefused", f"delivery refused: {wrong}", remote=remote)
        return HookAnswer(401, {"detail": f"signature refused: {wrong}"})
    event_type = next((headers[h] for h in EVENT_HEADERS if headers.get(h)), "")
    if event_type == "ping":
        _event(trigger, "Ping", "the sender checked the hook", remote=remote)
        return HookAnswer(200, {"pong": True})
    if event_type and event_type != trigger.spec["event"]:
        _event(
            trigger,
            "Ignored",
            f"a {event_type!r} delivery; this trigger starts runs for {trigger.spec['event']!r}",
            remote=remote,
        )
        return HookAnswer(202, {"started": False, "detail": f"event {event_type!r} is not {trigger.spec['event']!r}"})
    delivery = next((headers[h] for h in DELIVERY_HEADERS if headers.get(h)), "").strip()
    if not delivery or len(delivery) > 200:
        return HookAnswer(
            400, {"detail": f"a delivery id (1-200 characters) is required in one of: {', '.join(DELIVERY_HEADERS)}"}
        )
    try:
        payload = _body_parse(body, headers.get("Content-Type", "application/json"))
    except (ValueError, UnicodeDecodeError) as exc:
        _event(trigger, "BodyRefused", f"delivery {delivery}: the body is not JSON: {exc}", remote=remote)
        return HookAnswer(400, {"detail": f"the body is not JSON: {exc}"})
    cause = {"type": "webhook", "trigger": trigger.name, "delivery": delivery, "event": trigger.spec["event"]}
    try:
        with transaction.atomic():
            firing = TriggerFiring.objects.create(trigger=trigger, key=delivery, cause=cause, payload=payload)
        replayed = False
    except IntegrityError:
        firing = TriggerFiring.objects.get(trigger=trigger, key=delivery)
        replayed = True
    if not replayed:
        firing = firing_process(firing.pk) or firing
    answer: dict[str, Any] = {"delivery": delivery, "status": firing.status, "replayed": replayed}
    if firing.run_id is not None:
        answer |= {
            "run": str(firing.run_id),
            "run_name": str(Run.objects.select_related("pipeline").get(pk=firing.run_id)),
        }
    if firing.error:
        answer["detail"] = firing.error
    codes: dict[str, int] = {FiringStatus.STARTED: 201, FiringStatus.SKIPPED: 202}
    status = 200 if replayed else codes.get(firing.status, 422)
    return HookAnswer(status, answer)


# --- pausing ------------------------------------------------------------------------------------


def trigger_pause(*, trigger: Trigger, paused: bool, actor: Any) -> Trigger:
    """Pause (nothing starts; each cause it skips is an event) or resume the trigger."""
    access.require_actor(actor, "update", "pipelines", trigger.namespace)
    with transaction.atomic():
        trigger = Trigger.objects.select_for_update().select_related("pipeline").get(pk=trigger.pk)
        if trigger.paused == paused:
            raise Conflict(f"trigger {trigger} is {'paused' if paused else 'not paused'} already")
        before = {"paused": trigger.paused}
        who = actor if actor is not None and getattr(actor, "is_authenticated", False) else None
        trigger.paused, trigger.paused_by, trigger.paused_at = (
            paused,
            who if paused else None,
            timezone.now() if paused else None,
        )
        fields = ["paused", "paused_by", "paused_at", "updated_at"]
        if not paused and trigger.type == TriggerType.CRON:
            trigger.next_fire_at = cron_next(trigger.spec, timezone.now())  # what passed while paused was skipped
            fields.append("next_fire_at")
        trigger.save(update_fields=fields)
        _event(trigger, "Paused" if paused else "Resumed", "", actor=actor)
        audit.audit_write(
            action="trigger.pause" if paused else "trigger.resume",
            resource="pipelines",
            object_id=trigger.pk,
            object_name=str(trigger),
            namespace=trigger.namespace,
            before=before,
            after={"paused": paused},
            actor=actor,
        )
    return trigger
