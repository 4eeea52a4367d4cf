"""Every write of the agent gateway: declaration and install data, tokens, connections, commands.

Identity. An agent is a record of kind ``agent``. ``agent_declare`` issues a single-use,
short-lived bootstrap token; the agent's first connect exchanges it for a long-lived
credential. Only SHA-256 digests are stored. A credential belongs to exactly one agent
record; every refusal (unknown, foreign, used, revoked, expired) is an ``error`` event on the
agent record(s) involved, and the connection is closed with a code from ``protocol``.

Phase. The record is ``ready`` while its agent is connected: the hello moves it to ``ready``
(through ``creating`` when it was never ready); a disconnect sets the ``Connected`` condition
to false at once, and a disconnection that outlives ``GRAPHENE_AGENT_DISCONNECT_GRACE_SECONDS``
turns it ``drifted`` (a reconnect makes it ``ready`` again). Moves go through the records
app's ``record_transition``, the one place that checks them and writes their events.

Commands. A command is a row, stored before it is sent; the socket is only delivery. The
consumer of the agent's connection is told "there is work" through the channel layer (group
``agent.<id>``) and reads the rows. After a reconnect every open command is sent again; the
agent de-duplicates by id and answers with what it knows, so a command never runs twice
because it was re-sent. An at-most-once command whose agent vanished mid-flight (restarted
while running it, or gone past the grace period) becomes ``unknown``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import keyword
import logging
import secrets
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from graphene_agent import protocol

from apps.agents.choices import IN_FLIGHT, OPEN, TERMINAL, TRANSITIONS, CommandKind, CommandStatus, Guarantee, TokenKind
from apps.agents.models import Agent, AgentCapability, AgentCommand, AgentToken
from apps.core import domain
from apps.core.errors import Conflict, GrapheneError, ValidationFailed
from apps.core.events import publish_on_commit
from apps.observability.services import log_write_lines
from apps.records import services as records
from apps.records.choices import EventType, Phase
from apps.records.models import Record

logger = logging.getLogger(__name__)

AGENT_KIND = "agent"
BOOTSTRAP_PREFIX = "gab_"
CREDENTIAL_PREFIX = "gac_"
MAX_TAIL_CHARS = 64 * 1024
MAX_ARGV = 4096
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600
# Result keys kept from an agent's answer besides status, exit code, error and tails.
RESULT_KEYS = (
    "signal",
    "timed_out",
    "duration_s",
    "size",
    "sha256",
    "data",
    "mode",
    "replayed",
    "dropped_chunks",
    # call: the function's JSON value, or what it raised (type name, message, traceback).
    "value",
    "error_type",
    "error_message",
    "traceback",
)


class IllegalCommandTransition(GrapheneError):
    code = "illegal_transition"


class AgentRefused(GrapheneError):
    """The gateway refuses a connection; ``close_code`` is what the socket is closed with."""

    status_code = 403
    code = "agent_refused"

    def __init__(self, detail: str, *, close_code: int, reason: str) -> None:
        super().__init__(detail)
        self.close_code = close_code
        self.reason = reason


@dataclass(frozen=True)
class Authenticated:
    record_id: uuid.UUID
    credential: str | None  # only when a bootstrap token was exchanged


class AgentInstall(NamedTuple):
    """What ``agent_declare`` returns. ``bootstrap_token`` is a secret until it is used."""

    record: Record
    bootstrap_token: str
    install_script: str


def agent_group(record_id: Any) -> str:
    """The Channels group of an agent's connection (hints only: the rows are the truth)."""
    return f"agent.{record_id}"


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _now() -> datetime:
    return timezone.now()


def _record_event(record_id: Any, type: str, *, reason: str, message: str, data: dict[str, Any] | None = None) -> None:
    records.record_event_write(record_id, type, reason=reason, message=message, data=data)


def _set_condition(
    conditions: Sequence[Mapping[str, Any]], type: str, status: bool, *, reason: str, message: str
) -> list[dict[str, Any]]:
    """Kubernetes-style conditions: one entry per type; the time moves only when the status does."""
    now = _now().isoformat()
    out: list[dict[str, Any]] = []
    found = False
    for condition in conditions:
        if condition.get("type") != type:
            out.append(dict(condition))
            continue
        found = True
        changed = condition.get("status") != ("True" if status else "False")
        out.append(
            {
                "type": type,
                "status": "True" if status else "False",
                "reason": reason,
                "message": message,
                "last_transition_at": now if changed else condition.get("last_transition_at", now),
            }
        )
    if not found:
        out.append(
            {
                "type": type,
                "status": "True" if status else "False",
                "reason": reason,
                "message": message,
                "last_transition_at": now,
            }
        )
    return out


# --- declaration and install data --------------------------------------------------------------


def agent_declare(
    *,
    owner: Record,
    name: str,
    labels: dict[str, str] | None = None,
    actor: records.Actor = None,
    server_url: str | None = None,
    bootstrap_ttl: timedelta | None = None,
    needs: list[dict[str, Any]] | None = None,
) -> AgentInstall:
    """Declare an agent record under ``owner`` and issue install data for a machine.

    Re-declaring returns the same record (and a fresh bootstrap token: each one is single-use).
    The install script works as cloud-init user-data or over SSH: it downloads the zipapp from
    the server, checks its SHA-256, writes a 0600 env file and starts the agent.
    """
    from apps.agents.bundle import agent_bundle

    bundle = agent_bundle()  # built before the transaction: file work, not database work
    with transaction.atomic():
        record = agent_record_declare(owner=owner, name=name, labels=labels, actor=actor, needs=needs)
        token = agent_bootstrap_issue(record=record, ttl=bootstrap_ttl)
    script = agent_install_script(record=record, bootstrap_token=token, server_url=server_url, pyz_sha256=bundle.sha256)
    return AgentInstall(record=record, bootstrap_token=token, install_script=script)


def agent_record_declare(
    *,
    owner: Record,
    name: str,
    labels: dict[str, str] | None = None,
    actor: records.Actor = None,
    needs: list[dict[str, Any]] | None = None,
) -> Record:
    """Declare the agent record under ``owner`` (idempotent) without issuing a token.

    For installs that issue their own token when they really install (``ssh_install``), so
    that a replayed declaration leaves no unused bootstrap token behind. With ``needs`` the
    record is ready only while its agent is connected *and* its machine publishes them.
    """
    spec = {"needs": needs_clean(needs)} if needs else {}
    with transaction.atomic():
        record = records.record_declare(kind=AGENT_KIND, name=name, owner=owner, spec=spec, labels=labels, actor=actor)
        Agent.objects.get_or_create(record=record)
    return record


def agent_bootstrap_issue(*, record: Record, ttl: timedelta | None = None) -> str:
    """A new single-use bootstrap token for ``record`` (returned once; only its digest is kept)."""
    if record.kind != AGENT_KIND:
        raise ValidationFailed(f"{record} is not an agent record", fields={"record": ["must be of kind agent"]})
    if record.phase == Phase.DELETED or record.deletion_requested_at is not None:
        raise Conflict(f"{record} ({record.pk}) is being deleted; it cannot be enrolled")
    ttl = ttl or timedelta(seconds=settings.GRAPHENE_AGENT_BOOTSTRAP_TTL_SECONDS)
    if ttl <= timedelta(0):
        raise ValidationFailed("the bootstrap token's lifetime must be positive", fields={"bootstrap_ttl": ["> 0"]})
    token = BOOTSTRAP_PREFIX + secrets.token_urlsafe(32)
    now = _now()
    AgentToken.objects.create(
        agent=record,
        kind=TokenKind.BOOTSTRAP,
        digest=_digest(token),
        prefix=token[:10],
        created_at=now,
        expires_at=now + ttl,
    )
    return token


def agent_env_file(*, record: Record, bootstrap_token: str, server_url: str | None = None) -> str:
    """The agent's config file (``KEY=VALUE``; install it with mode 0600: it holds the token)."""
    # k=v,k=v on one line: labels whose values would break that format stay on the record only.
    labels = ",".join(
        f"{k}={v}" for k, v in sorted(record.labels.items()) if not any(c in f"{k}{v}" for c in ",\n\r\x00")
    )
    lines = [
        "# graphene-agent configuration (keep it mode 0600: the bootstrap token is a secret until used)",
        f"GRAPHENE_AGENT_SERVER={server_url or settings.GRAPHENE_AGENT_SERVER_URL}",
        f"GRAPHENE_AGENT_ID={record.pk}",
        f"GRAPHENE_AGENT_BOOTSTRAP_TOKEN={bootstrap_token}",
    ]
    if labels:
        lines.append(f"GRAPHENE_AGENT_LABELS={labels}")
    return "\n".join(lines) + "\n"


def agent_install_script(
    *, record: Record, bootstrap_token: str, server_url: str | None = None, pyz_sha256: str | None = None
) -> str:
    """A POSIX shell script (cloud-init user-data compatible) that installs and starts the agent."""
    from apps.agents.bundle import agent_bundle
    from apps.agents.install import render_install_script

    server = (server_url or settings.GRAPHENE_AGENT_SERVER_URL).rstrip("/")
    return render_install_script(
        server_url=server,
        pyz_sha256=pyz_sha256 or agent_bundle().sha256,
        env_file=agent_env_file(record=record, bootstrap_token=bootstrap_token, server_url=server),
        agent_name=record.name,
    )


def agent_credentials_revoke(*, record: Record, reason: str = "revoked") -> int:
    """Revoke every token of the agent and close its connection; it needs a new bootstrap."""
    now = _now()
    with transaction.atomic():
        count = AgentToken.objects.filter(agent=record, revoked_at__isnull=True).update(
            revoked_at=now, revoked_reason=reason[:120]
        )
        _record_event(
            record.pk, EventType.ERROR, reason="CredentialsRevoked", message=f"{count} token(s) revoked: {reason}"
        )
        publish_on_commit(
            agent_group(record.pk),
            {"event": "agent.close", "code": protocol.CLOSE_REFUSED, "reason": f"the credential was revoked: {reason}"},
        )
    return count


# --- authentication ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Refusal:
    close_code: int
    reason: str
    message: str
    record_ids: tuple[Any, ...]
    data: dict[str, Any]


def agent_authenticate(
    *, agent_id: str, credential: str | None = None, bootstrap_token: str | None = None, peer: str = ""
) -> Authenticated:
    """Check what a connecting agent presents; exchange a bootstrap token for a credential.

    Raises ``AgentRefused`` (after committing an ``error`` event on the agent records
    involved) for anything but a valid, current token of the claimed agent.
    """
    try:
        claimed = uuid.UUID(str(agent_id))
    except ValueError:
        raise AgentRefused(
            f"agent_id {agent_id!r} is not a UUID", close_code=protocol.CLOSE_UNAUTHENTICATED, reason="BadAgentId"
        ) from None
    with transaction.atomic():
        outcome = _authenticate(claimed, credential, bootstrap_token, peer)
    if isinstance(outcome, _Refusal):
        with transaction.atomic():
            for record_id in outcome.record_ids:
                _record_event(
                    record_id, EventType.ERROR, reason=outcome.reason, message=outcome.message, data=outcome.data
                )
        logger.warning("agent %s from %s refused: %s", claimed, peer or "?", outcome.message)
        raise AgentRefused(outcome.message, close_code=outcome.close_code, reason=outcome.reason)
    return outcome


def _authenticate(
    claimed: uuid.UUID, credential: str | None, bootstrap_token: str | None, peer: str
) -> Authenticated | _Refusal:
    now = _now()
    kind = TokenKind.CREDENTIAL if credential else TokenKind.BOOTSTRAP
    secret = credential or bootstrap_token or ""
    noun = "credential" if kind == TokenKind.CREDENTIAL else "bootstrap token"
    claimed_ids = tuple(Record.objects.filter(pk=claimed, kind=AGENT_KIND).values_list("pk", flat=True))
    data: dict[str, Any] = {"peer": peer, "claimed_agent": str(claimed), "presented": noun}

    def refuse(code: int, reason: str, message: str, ids: tuple[Any, ...] = claimed_ids) -> _Refusal:
        return _Refusal(code, reason, message, ids, data)

    if not secret:
        return refuse(protocol.CLOSE_UNAUTHENTICATED, "NoCredential", "the agent presented no credential or token")
    token = AgentToken.objects.select_for_update().filter(digest=_digest(secret), kind=kind).first()
    if token is None:
        return refuse(protocol.CLOSE_UNAUTHENTICATED, "UnknownCredential", f"the {noun} presented is not known")
    data["token"] = token.prefix
    if token.agent_id != claimed:
        return refuse(
            protocol.CLOSE_REFUSED,
            "ForeignCredential",
            f"agent {claimed} presented a {noun} that belongs to agent {token.agent_id}",
            tuple({*claimed_ids, token.agent_id}),
        )
    record = Record.objects.get(pk=token.agent_id)
    if _retired(record):
        return refuse(protocol.CLOSE_DELETED, "AgentDeleted", f"agent {record.pk} is deleted or being deleted")
    if token.revoked_at is not None:
        why = f": {token.revoked_reason}" if token.revoked_reason else ""
        return refuse(protocol.CLOSE_REFUSED, f"{kind.title()}Revoked", f"the {noun} was revoked{why}")
    if token.expires_at is not None and token.expires_at <= now:
        return refuse(protocol.CLOSE_REFUSED, f"{kind.title()}Expired", f"the {noun} expired at {token.expires_at}")
    if kind == TokenKind.CREDENTIAL:
        AgentToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return Authenticated(record_id=record.pk, credential=None)
    if token.used_at is not None:
        return refuse(
            protocol.CLOSE_REFUSED,
            "BootstrapTokenReused",
            f"the bootstrap token was already exchanged at {token.used_at.isoformat()}; it is single-use",
        )
    # The exchange: this enrollment replaces any earlier one (a re-installed machine).
    AgentToken.objects.filter(pk=token.pk).update(used_at=now, last_used_at=now)
    AgentToken.objects.filter(agent=record, revoked_at__isnull=True).exclude(pk=token.pk).update(
        revoked_at=now, revoked_reason="replaced by a new enrollment"
    )
    issued = CREDENTIAL_PREFIX + secrets.token_urlsafe(32)
    days = settings.GRAPHENE_AGENT_CREDENTIAL_TTL_DAYS
    AgentToken.objects.create(
        agent=record,
        kind=TokenKind.CREDENTIAL,
        digest=_digest(issued),
        prefix=issued[:10],
        created_at=now,
        expires_at=now + timedelta(days=days) if days > 0 else None,
    )
    return Authenticated(record_id=record.pk, credential=issued)


def _retired(record: Record) -> bool:
    """The agent record itself is being deleted (its tokens are revoked, it takes no commands).

    A requested deletion alone does not retire it: records on its machine (its children)
    are deleted first, through it, so it keeps serving until its own turn comes.
    """
    return record.phase in (Phase.DELETING, Phase.DELETED, Phase.DELETE_FAILED)


# --- connection --------------------------------------------------------------------------------


def agent_connect(
    *,
    record_id: Any,
    session: uuid.UUID,
    channel_name: str,
    instance: str,
    version: str,
    facts: dict[str, Any],
    peer: str = "",
) -> str | None:
    """The agent said hello on connection ``session``: it is now the current one.

    Records the facts in the record's outputs, sets ``Connected``, moves the record to
    ``ready``, and returns the channel of a previous connection to close (it is superseded).
    """
    now = _now()
    with transaction.atomic():
        record = Record.objects.select_for_update(no_key=True).get(pk=record_id)
        if _retired(record):
            raise AgentRefused(
                f"agent {record.pk} is being deleted", close_code=protocol.CLOSE_DELETED, reason="AgentDeleted"
            )
        state, _ = Agent.objects.select_for_update().get_or_create(record_id=record.pk)
        previous = state.channel_name if state.session is not None and state.session != session else None
        Agent.objects.filter(pk=record.pk).update(
            session=session,
            channel_name=channel_name,
            instance=instance[:64],
            version=version[:40],
            peer=peer[:100],
            connected_at=now,
            last_seen_at=now,
            disconnected_at=None,
            lost_at=None,
        )
        outputs = {"facts": facts, "version": version, "instance": instance}
        conditions = _set_condition(
            record.conditions, "Connected", True, reason="Connected", message=f"connected from {peer or 'unknown'}"
        )
        fields = {
            "outputs": outputs,
            "conditions": conditions,
            "attempts": 0,
            "next_attempt_at": None,
            "last_error": "",
            "observed_generation": record.generation,
        }
        from apps.agents.selectors import agent_declared_needs_unmet  # selectors import this module

        unmet = agent_declared_needs_unmet(record=record)
        if unmet is not None:
            fields["conditions"] = conditions = _needs_condition(conditions, unmet)
        if record.phase in (Phase.PENDING, Phase.CREATE_FAILED):
            records.record_transition([record], Phase.CREATING, reason="Connected", message="the agent connected")
        if unmet:  # connected, but not what the declaration needs: not ready (yet)
            _settle(record, fields, ready=False, reason="NeedsUnmet", message="; ".join(unmet))
        elif record.phase != Phase.READY:
            records.record_transition(
                [record], Phase.READY, reason="Connected", message="the agent said hello", fields=fields
            )
        else:
            Record.objects.filter(pk=record.pk).update(updated_at=now, **fields)
            publish_on_commit("records", {"event": "records.changed", "ids": [str(record.pk)]})
    return previous


def _needs_condition(conditions: Sequence[Mapping[str, Any]], unmet: list[str]) -> list[dict[str, Any]]:
    if unmet:
        return _set_condition(conditions, "NeedsMet", False, reason="NeedsUnmet", message="; ".join(unmet))
    return _set_condition(conditions, "NeedsMet", True, reason="NeedsMet", message="every need is published")


def _settle(record: Record, fields: dict[str, Any], *, ready: bool, reason: str, message: str) -> None:
    """Move a connected agent's record to what its needs say: ``ready``, or not (``creating``
    before it was ever ready, ``drifted`` after), writing ``fields`` with the move."""
    was_ready = record.phase in (Phase.READY, Phase.DRIFTED)
    target = Phase.READY if ready else (Phase.DRIFTED if was_ready else Phase.CREATING)
    if record.phase == Phase.PENDING:
        records.record_transition([record], Phase.CREATING, reason=reason, message=message)
    if record.phase != target:
        records.record_transition([record], target, reason=reason, message=message, fields=fields)
    else:
        Record.objects.filter(pk=record.pk).update(updated_at=_now(), **fields)
        publish_on_commit("records", {"event": "records.changed", "ids": [str(record.pk)]})


def _needs_settle(record: Record) -> None:
    """Re-decide a connected agent's readiness after what its machine offers changed.

    ``record`` is locked by the caller (``capability_publish``) and not being deleted.
    """
    from apps.agents.selectors import agent_declared_needs_unmet  # selectors import this module

    unmet = agent_declared_needs_unmet(record=record)
    if unmet is None or not Agent.objects.filter(pk=record.pk, session__isnull=False).exists():
        return  # no needs (readiness is the connection's), or away (the hello decides)
    fields: dict[str, Any] = {"conditions": _needs_condition(record.conditions, unmet)}
    if unmet:
        _settle(record, fields, ready=False, reason="NeedsUnmet", message="; ".join(unmet))
    else:
        fields.update(attempts=0, next_attempt_at=None, last_error="", observed_generation=record.generation)
        _settle(record, fields, ready=True, reason="NeedsMet", message="the machine publishes every need")


def agent_heartbeat(*, record_id: Any, session: uuid.UUID) -> bool:
    """Note that the agent is alive; ``False`` if this connection is no longer the current one."""
    return Agent.objects.filter(pk=record_id, session=session).update(last_seen_at=_now()) == 1


def agent_disconnect(*, record_id: Any, session: uuid.UUID, reason: str = "Disconnected") -> bool:
    """Connection ``session`` ended. Sets ``Connected`` false; the phase waits out the grace period."""
    now = _now()
    with transaction.atomic():
        if not Agent.objects.filter(pk=record_id, session=session).update(
            session=None, channel_name="", disconnected_at=now
        ):
            return False  # superseded by a newer connection: nothing to change
        record = Record.objects.select_for_update(no_key=True).get(pk=record_id)
        conditions = _set_condition(
            record.conditions, "Connected", False, reason=reason, message=f"disconnected at {now.isoformat()}"
        )
        Record.objects.filter(pk=record.pk).update(conditions=conditions, updated_at=now)
        publish_on_commit("records", {"event": "records.changed", "ids": [str(record.pk)]})
    return True


def agents_mark_lost(*, now: datetime | None = None) -> int:
    """Agents disconnected past the grace period: record ``drifted``, in-flight at-most-once ``unknown``.

    Also ends connections whose heartbeats stopped (a web process that died without closing
    them leaves them looking connected).
    """
    now = now or _now()
    grace = timedelta(seconds=settings.GRAPHENE_AGENT_DISCONNECT_GRACE_SECONDS)
    silent = now - max(grace, timedelta(seconds=3 * settings.GRAPHENE_AGENT_HEARTBEAT_SECONDS))
    for state in Agent.objects.filter(session__isnull=False, last_seen_at__lt=silent):
        if state.session is not None:
            agent_disconnect(record_id=state.pk, session=state.session, reason="HeartbeatsStopped")
    lost = 0
    candidates = Agent.objects.filter(session__isnull=True, lost_at__isnull=True, disconnected_at__lte=now - grace)
    for record_id in candidates.values_list("pk", flat=True):
        with transaction.atomic():
            record = Record.objects.select_for_update(no_key=True).get(pk=record_id)
            state = Agent.objects.select_for_update().get(pk=record_id)
            if state.session is not None or state.lost_at is not None or state.disconnected_at is None:
                continue
            Agent.objects.filter(pk=record_id).update(lost_at=now)
            since = state.disconnected_at.isoformat()
            conditions = _set_condition(
                record.conditions, "Connected", False, reason="Lost", message=f"no reconnect since {since}"
            )
            if record.phase == Phase.READY and record.deletion_requested_at is None:
                records.record_transition(
                    [record],
                    Phase.DRIFTED,
                    reason="AgentLost",
                    message=f"disconnected since {since}, past the {grace.total_seconds():.0f}s grace period",
                    fields={"conditions": conditions},
                )
            else:
                Record.objects.filter(pk=record_id).update(conditions=conditions, updated_at=now)
            _commands_vanished(record_id, f"the agent vanished while it was in flight (disconnected since {since})")
            lost += 1
    return lost


def _commands_vanished(record_id: Any, why: str) -> None:
    """At-most-once commands the agent may have been running: their outcome is unknown."""
    rows = AgentCommand.objects.select_for_update(no_key=True).filter(
        agent_id=record_id, guarantee=Guarantee.AT_MOST_ONCE, status__in=sorted(IN_FLIGHT)
    )
    for command in rows:
        _command_finish_row(command, CommandStatus.UNKNOWN, error=why)


# --- commands: submit and cancel ----------------------------------------------------------------


def _fail(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(f"{field}: {message}", fields={field: [message]})


def _absolute_path(payload: Mapping[str, Any], field: str = "path") -> str:
    path = payload.get(field)
    if not isinstance(path, str) or not path:
        raise _fail(field, "required: an absolute path on the agent's machine")
    if not path.startswith("/") or "\x00" in path:
        raise _fail(field, f"must be an absolute path without NUL bytes, got {path!r}")
    return path


def command_payload_validate(kind: str, payload: Any) -> dict[str, Any]:
    """Check and normalize a command's payload; every error names its field."""
    if kind not in CommandKind.values:
        raise _fail("kind", f"unknown command kind {kind!r}; kinds are {CommandKind.values}")
    if not isinstance(payload, Mapping):
        raise _fail("payload", "must be a JSON object")
    allowed = {
        CommandKind.EXEC: {"argv", "env", "cwd", "timeout"},
        CommandKind.PUT_FILE: {"path", "data", "mode", "make_dirs"},
        CommandKind.GET_FILE: {"path", "max_bytes"},
        CommandKind.CALL: {"name", "source", "args", "kwargs", "timeout"},
    }[CommandKind(kind)]
    unknown = sorted(set(payload) - allowed)
    if unknown:
        raise ValidationFailed(
            f"unknown field(s) {unknown} for {kind}; allowed: {sorted(allowed)}",
            fields={name: ["unknown field"] for name in unknown},
        )
    if kind == CommandKind.EXEC:
        return _exec_payload(payload)
    if kind == CommandKind.CALL:
        return _call_payload(payload)
    if kind == CommandKind.PUT_FILE:
        data = payload.get("data")
        if not isinstance(data, str):
            raise _fail("data", "required: the file's content, base64-encoded")
        try:
            size = len(base64.b64decode(data, validate=True))
        except (binascii.Error, ValueError):
            raise _fail("data", "is not valid base64") from None
        if size > protocol.MAX_PUT_FILE_BYTES:
            raise _fail("data", f"{size} bytes is more than the {protocol.MAX_PUT_FILE_BYTES} a put_file carries")
        mode = payload.get("mode", 0o644)
        if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
            raise _fail("mode", "must be an integer between 0 and 0o7777 (4095)")
        make_dirs = payload.get("make_dirs", True)
        if not isinstance(make_dirs, bool):
            raise _fail("make_dirs", "must be true or false")
        return {"path": _absolute_path(payload), "data": data, "mode": mode, "make_dirs": make_dirs}
    max_bytes = payload.get("max_bytes", protocol.MAX_GET_FILE_BYTES)
    if (
        not isinstance(max_bytes, int)
        or isinstance(max_bytes, bool)
        or not 0 < max_bytes <= protocol.MAX_GET_FILE_BYTES
    ):
        raise _fail("max_bytes", f"must be an integer between 1 and {protocol.MAX_GET_FILE_BYTES}")
    return {"path": _absolute_path(payload), "max_bytes": max_bytes}


def _call_payload(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A Python function for the agent's machine: its source, its name, JSON arguments."""
    source = payload.get("source")
    if not isinstance(source, str) or not source.strip():
        raise _fail("source", "required: the function's source code (a def statement)")
    if "\x00" in source:
        raise _fail("source", "contains a NUL byte")
    if len(json.dumps(source)) > protocol.MAX_CALL_SOURCE_BYTES:
        size = len(json.dumps(source))
        raise _fail("source", f"{size} bytes of JSON, more than the {protocol.MAX_CALL_SOURCE_BYTES} a call carries")
    name = payload.get("name")
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise _fail("name", f"must be the function's name (a Python identifier), got {name!r}")
    args = payload.get("args", [])
    if not isinstance(args, list):
        raise _fail("args", "must be a list (the positional arguments, as JSON)")
    kwargs = payload.get("kwargs", {})
    if not isinstance(kwargs, Mapping):
        raise _fail("kwargs", "must be an object (the keyword arguments, as JSON)")
    for key in kwargs:
        if not isinstance(key, str) or not key.isidentifier():
            raise ValidationFailed(
                f"kwargs: {key!r} is not a parameter name", fields={f"kwargs.{key}": ["not an identifier"]}
            )
    size = len(json.dumps([args, kwargs]).encode())
    if size > protocol.MAX_CALL_ARGS_BYTES:
        raise _fail(
            "args",
            f"the arguments are {size} bytes of JSON, more than the {protocol.MAX_CALL_ARGS_BYTES} a call carries",
        )
    timeout = _timeout(payload)
    return {"name": name, "source": source, "args": list(args), "kwargs": dict(kwargs), "timeout": timeout}


def _timeout(payload: Mapping[str, Any]) -> float | None:
    timeout = payload.get("timeout")
    if timeout is not None:
        if not isinstance(timeout, int | float) or isinstance(timeout, bool):
            raise _fail("timeout", "must be a number of seconds")
        if not 0 < timeout <= MAX_TIMEOUT_SECONDS:
            raise _fail("timeout", f"must be more than 0 and at most {MAX_TIMEOUT_SECONDS} seconds")
    return timeout


def _exec_payload(payload: Mapping[str, Any]) -> dict[str, Any]:
    argv = payload.get("argv")
    if not isinstance(argv, list) or not argv:
        raise _fail("argv", "required: a non-empty list of strings (the program and its arguments)")
    if len(argv) > MAX_ARGV:
        raise _fail("argv", f"at most {MAX_ARGV} arguments")
    for index, arg in enumerate(argv):
        if not isinstance(arg, str):
            raise ValidationFailed(
                f"argv.{index}: must be a string, got {type(arg).__name__}", fields={f"argv.{index}": ["not a string"]}
            )
        if "\x00" in arg:
            raise ValidationFailed(f"argv.{index}: contains a NUL byte", fields={f"argv.{index}": ["NUL byte"]})
    if not argv[0]:
        raise ValidationFailed("argv.0: the program must not be empty", fields={"argv.0": ["empty"]})
    env = payload.get("env") or {}
    if not isinstance(env, Mapping):
        raise _fail("env", "must be an object mapping variable names to string values")
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\x00" in key:
            raise ValidationFailed(
                f"env: {key!r} is not a valid variable name", fields={f"env.{key}": ["invalid variable name"]}
            )
        if not isinstance(value, str) or "\x00" in value:
            raise ValidationFailed(
                f"env.{key}: must be a string without NUL bytes", fields={f"env.{key}": ["must be a string"]}
            )
    cwd = payload.get("cwd")
    if cwd is not None and cwd != "":
        cwd = _absolute_path(payload, "cwd")
    timeout = _timeout(payload)
    return {"argv": list(argv), "env": dict(env), "cwd": cwd or None, "timeout": timeout}


def command_submit(
    *,
    agent: Record,
    kind: str,
    payload: Mapping[str, Any],
    guarantee: str = Guarantee.AT_LEAST_ONCE,
    actor: records.Actor = None,
    log_to: Iterable[Any] = (),
    waiting_record: Any = None,
    operation: str = "",
    sealed: bool = False,
    in_process: bool = False,
) -> AgentCommand:
    """Store a command for ``agent`` and tell its connection (if any) after commit.

    It is delivered now if the agent is connected, else when it connects. ``log_to`` names
    more records (e.g. a run) whose logs receive the command's output besides the agent's.
    ``waiting_record`` is a record whose convergence or deletion waits on the command (an
    object on the agent's machine): it is woken when the command ends, and such commands are
    taken while the agent's own deletion is requested (its machine's records go first);
    ``operation`` names what that record's kind asked for; one starting with ``sync:``
    (``SYNC_OPERATION``) is waited for by the very worker that submitted it, which takes its
    result itself, so its end wakes nobody. A ``sealed`` payload (it carries a
    secret's value) is stored encrypted with the secrets key and opened only to be sent (I7).
    ``in_process`` (a ``call`` of the server's own self-contained function, bounded by its own
    timeouts: the kinds' operations on a machine) lets the agent call it in a thread of its
    process instead of a fresh interpreter, about 100 ms less a call; never a user's function,
    and not a field the API accepts.
    """
    if agent.kind != AGENT_KIND:
        raise _fail("agent", f"{agent} is not an agent record")
    if guarantee not in Guarantee.values:
        raise _fail("guarantee", f"unknown guarantee {guarantee!r}; guarantees are {Guarantee.values}")
    clean = command_payload_validate(kind, payload)
    if in_process:
        if kind != CommandKind.CALL:
            raise _fail("in_process", f"only a call runs in the agent's process, not {kind}")
        clean["in_process"] = True
    extra_logs = [str(uuid.UUID(str(r))) for r in log_to]
    with transaction.atomic():
        current = Record.objects.filter(pk=agent.pk).values("phase", "deletion_requested_at").first()
        if (
            current is None
            or current["phase"] in (Phase.DELETING, Phase.DELETED, Phase.DELETE_FAILED)
            or (current["deletion_requested_at"] is not None and waiting_record is None)
        ):
            raise Conflict(f"agent {agent.name} ({agent.pk}) is deleted or being deleted; it takes no commands")
        command_id = uuid.uuid4()
        command = AgentCommand.objects.create(
            id=command_id,
            agent=agent,
            kind=kind,
            payload=_seal(command_id, clean) if sealed else clean,
            operation=operation[:40],
            guarantee=guarantee,
            log_record_ids=extra_logs,
            waiting_record_id=waiting_record,
            requested_by_id=actor.pk if actor is not None and actor.is_authenticated else None,
            created_at=_now(),
        )
        publish_on_commit(agent_group(agent.pk), {"event": "agent.commands"})
    return command


def command_cancel(*, command: AgentCommand, actor: records.Actor = None) -> AgentCommand:
    """Cancel: a queued command never goes out; a sent or running one is killed on the agent."""
    with transaction.atomic():
        command = AgentCommand.objects.select_for_update(no_key=True).get(pk=command.pk)
        if command.status in TERMINAL:
            return command
        if command.status == CommandStatus.QUEUED:
            _command_finish_row(command, CommandStatus.CANCELLED, error="cancelled before it was sent")
            return command
        if command.cancel_requested_at is None:
            command.cancel_requested_at = _now()
            AgentCommand.objects.filter(pk=command.pk).update(cancel_requested_at=command.cancel_requested_at)
        publish_on_commit(agent_group(command.agent_id), {"event": "agent.commands"})
    return command


# --- commands: delivery and results (called by the gateway consumer) -----------------------------


SEALED = "$sealed"
# The prefix of an ``operation`` whose submitter waits for the command in place (the docker
# kinds' HTTP requests through an agent): waking its record would only start a duplicate.
SYNC_OPERATION = "sync:"


def _seal(command_id: uuid.UUID, payload: dict[str, Any]) -> dict[str, Any]:
    """The payload encrypted (bound to the command's id); only its function's name stays readable."""
    from apps.secrets.crypto import encrypt

    ciphertext, _key = encrypt(namespace="agent-command", name=str(command_id), value=json.dumps(payload))
    visible = {"name": payload["name"]} if "name" in payload else {}
    return {SEALED: ciphertext, **visible}


def _unsealed(command: AgentCommand) -> dict[str, Any]:
    from apps.secrets.crypto import decrypt

    payload = command.payload
    if SEALED not in payload:
        return payload
    opened: dict[str, Any] = json.loads(
        decrypt(namespace="agent-command", name=str(command.pk), ciphertext=payload[SEALED])
    )
    return opened


def _command_message(command: AgentCommand, *, redelivery: bool) -> dict[str, Any]:
    return {
        "type": "command",
        "id": str(command.pk),
        "kind": command.kind,
        "payload": _unsealed(command),
        "guarantee": command.guarantee,
        "redelivery": redelivery,
        "output_seq": command.output_seq,
    }


def commands_deliver(*, record_id: Any, session: uuid.UUID, everything: bool) -> list[dict[str, Any]]:
    """Messages to send on connection ``session``: queued commands (now ``sent``) and cancels.

    ``everything`` (right after the hello): also re-send every command already sent, since
    the agent may not have it, or has finished it and its result was lost with the old
    connection. The agent answers a known id from its journal instead of running it again.

    Commands that serve one record (``waiting_record_id``: operations on one object on the
    machine) go out one at a time, in order: the agent runs commands concurrently, and two
    writes of one file (an old spec's and a new one's) must not race. The next one is sent
    when the one before has ended (the gateway delivers again after each result).
    """
    now = _now()
    with transaction.atomic():
        if not Agent.objects.filter(pk=record_id, session=session).exists():
            return []  # fenced: this connection is no longer the agent's current one
        statuses = sorted(OPEN) if everything else [CommandStatus.QUEUED]
        rows = list(
            AgentCommand.objects.select_for_update(no_key=True, skip_locked=True)
            .filter(agent_id=record_id, status__in=statuses)
            .order_by("created_at", "pk")
        )
        cancels = list(
            AgentCommand.objects.filter(
                agent_id=record_id, status__in=sorted(IN_FLIGHT), cancel_requested_at__isnull=False
            ).values_list("pk", flat=True)
        )
        busy = set(
            AgentCommand.objects.filter(
                agent_id=record_id, status__in=sorted(IN_FLIGHT), waiting_record_id__isnull=False
            ).values_list("waiting_record_id", flat=True)
        )
        messages: list[dict[str, Any]] = []
        for command in rows:
            if command.cancel_requested_at is not None:
                continue  # only the cancel goes out (below): the agent answers it for any id
            serves = command.waiting_record_id
            if serves is not None and command.status == CommandStatus.QUEUED:
                if serves in busy:
                    continue  # an earlier operation on the same object is still running
                busy.add(serves)
            try:
                _unsealed(command)
            except GrapheneError as exc:  # sealed with a key that is gone: it can never be sent
                _command_finish_row(command, CommandStatus.CANCELLED, error=f"cannot open the command: {exc.detail}")
                continue
            redelivery = command.status != CommandStatus.QUEUED
            if not redelivery:
                _command_transition(command, CommandStatus.SENT)
            AgentCommand.objects.filter(pk=command.pk).update(
                status=command.status,
                sent_at=command.sent_at or now,
                deliveries=command.deliveries + 1,
                session=session,
            )
            messages.append(_command_message(command, redelivery=redelivery))
        messages.extend({"type": "cancel", "id": str(pk)} for pk in cancels)
    return messages


def command_accepted(*, record_id: Any, command_id: Any) -> None:
    """The agent started the command (or re-attached to it after a reconnect)."""
    with transaction.atomic():
        command = AgentCommand.objects.select_for_update(no_key=True).filter(pk=command_id, agent_id=record_id).first()
        if command is None or command.status != CommandStatus.SENT:
            return
        _command_transition(command, CommandStatus.RUNNING)
        AgentCommand.objects.filter(pk=command.pk).update(status=command.status, started_at=_now())


def command_output(*, record_id: Any, command_id: Any, seq: int, stream: str, data: str) -> int:
    """Store an output chunk as log lines, once; returns the sequence number to acknowledge."""
    with transaction.atomic():
        command = AgentCommand.objects.select_for_update(no_key=True).filter(pk=command_id, agent_id=record_id).first()
        if command is None:
            return seq  # not ours (or purged): let the agent forget it
        if seq <= command.output_seq:
            return command.output_seq  # a chunk re-sent after a reconnect: already stored
        lines = data.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if seq > command.output_seq + 1:
            missing = seq - command.output_seq - 1
            lines.insert(0, f"[graphene: {missing} output chunk(s) of this command were lost on the agent]")
        _log_lines(command, lines, stream="stderr" if stream == "stderr" else "stdout")
        fields: dict[str, Any] = {"output_seq": seq}
        if command.status == CommandStatus.SENT:
            _command_transition(command, CommandStatus.RUNNING)
            fields.update(status=command.status, started_at=_now())
        AgentCommand.objects.filter(pk=command.pk).update(**fields)
    return seq


def _log_lines(command: AgentCommand, lines: Sequence[str], *, stream: str) -> None:
    """The bulk form of ``observability.services.log_write`` (same fields, one statement per chunk).

    A chunk carries many lines; one statement per chunk instead of per line is what lets an
    agent stream tens of thousands of lines a second.
    """
    log_write_lines(
        record_ids=[command.agent_id, *command.log_record_ids],
        lines=lines,
        stream=stream,
        source=f"command/{command.pk}",
        at=_now(),
    )


def command_finish(*, record_id: Any, command_id: Any, result: Mapping[str, Any]) -> AgentCommand | None:
    """The agent's result for a command; stored once (a replayed result of a finished command is ignored)."""
    with transaction.atomic():
        command = AgentCommand.objects.select_for_update(no_key=True).filter(pk=command_id, agent_id=record_id).first()
        if command is None or command.status in TERMINAL:
            return command
        status = str(result.get("status", ""))
        error = str(result.get("error") or "")
        if status not in (protocol.SUCCEEDED, protocol.FAILED, protocol.CANCELLED, protocol.UNKNOWN):
            error = f"the agent reported an unknown status {status!r}. {error}".strip()
            status = CommandStatus.FAILED
        if status == protocol.UNKNOWN and command.guarantee == Guarantee.AT_LEAST_ONCE:
            # Only at-most-once commands may end unknown; an at-least-once one is run again.
            logger.warning("agent reported %s unknown although it is at least once", command.pk)
        exit_code = result.get("exit_code")
        extra = {key: result[key] for key in RESULT_KEYS if key in result}
        if int(result.get("output_seq") or 0) > command.output_seq:
            extra["output_incomplete"] = True
        _command_finish_row(
            command,
            CommandStatus(status),
            error=error,
            exit_code=exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None,
            stdout_tail=str(result.get("stdout_tail") or "")[-MAX_TAIL_CHARS:],
            stderr_tail=str(result.get("stderr_tail") or "")[-MAX_TAIL_CHARS:],
            result=extra,
        )
    return command


def _command_transition(command: AgentCommand, to: str) -> None:
    if to not in TRANSITIONS[command.status]:
        raise IllegalCommandTransition(f"command {command.pk} cannot go from {command.status} to {to}")
    command.status = to


def _command_finish_row(
    command: AgentCommand,
    status: CommandStatus,
    *,
    error: str = "",
    exit_code: int | None = None,
    stdout_tail: str = "",
    stderr_tail: str = "",
    result: dict[str, Any] | None = None,
) -> None:
    """End a locked command row; ``CommandFinished`` tells what waits on it, after commit."""
    _command_transition(command, status)
    now = _now()
    fields = {
        "status": status,
        "error": error,
        "exit_code": exit_code,
        "stdout_tail": stdout_tail,
        "stderr_tail": stderr_tail,
        "result": result or {},
        "finished_at": now,
    }
    if command.kind == CommandKind.PUT_FILE and "data" in command.payload:
        # Delivered, or it never will be: the content (base64) need not stay in the row
        # (the result keeps the size and SHA-256 the machine reported).
        fields["payload"] = {k: v for k, v in command.payload.items() if k != "data"}
    for name, value in fields.items():
        setattr(command, name, value)
    AgentCommand.objects.filter(pk=command.pk).update(**fields)
    publish_on_commit(
        "agents", {"event": "agent.command.changed", "id": str(command.pk), "agent": str(command.agent_id)}
    )
    argv = command.payload.get("argv") if isinstance(command.payload, dict) else None
    domain.emit(
        domain.CommandFinished(
            command_id=str(command.pk),
            agent_id=str(command.agent_id),
            kind=command.kind,
            status=command.status,
            guarantee=command.guarantee,
            deliveries=command.deliveries,
            program=str(argv[0]).rsplit("/", 1)[-1] if isinstance(argv, list) and argv else "",
            exit_code=command.exit_code,
            error=command.error,
            created_at=command.created_at,
            finished_at=now,
            waiting_record_id=str(command.waiting_record_id) if command.waiting_record_id is not None else None,
            awaited_in_place=command.operation.startswith(SYNC_OPERATION),
            log_record_ids=tuple(str(i) for i in command.log_record_ids or ()),
        )
    )


def record_wake_on_command(event: domain.CommandFinished) -> None:
    """Subscriber: a kind's command on a machine ended, so its record's convergence or deletion
    goes on now (a hint: without it the retry the kind asked for comes later)."""
    if event.waiting_record_id is not None and not event.awaited_in_place:
        records.record_wake(record_id=event.waiting_record_id)


def command_take(*, command: AgentCommand) -> bool:
    """Mark a finished command's result as used by the record waiting on it; ``False`` if it
    was taken already (a duplicate convergence or deletion got there first)."""
    return bool(
        AgentCommand.objects.filter(pk=command.pk, consumed_at__isnull=True, status__in=sorted(TERMINAL)).update(
            consumed_at=_now()
        )
    )


def agent_retire(*, record: Record) -> None:
    """The agent record is being deleted: revoke its tokens, end its commands, close its connection.

    Never waits for the machine: a machine that is gone for good must not block the deletion.
    """
    now = _now()
    with transaction.atomic():
        AgentToken.objects.filter(agent=record, revoked_at__isnull=True).update(
            revoked_at=now, revoked_reason="the agent record was deleted"
        )
        for command in AgentCommand.objects.select_for_update(no_key=True).filter(
            agent=record, status__in=sorted(OPEN)
        ):
            if command.status == CommandStatus.QUEUED or command.guarantee == Guarantee.AT_LEAST_ONCE:
                _command_finish_row(command, CommandStatus.CANCELLED, error="the agent record was deleted")
            else:
                _command_finish_row(
                    command, CommandStatus.UNKNOWN, error="the agent record was deleted while this was in flight"
                )
        Agent.objects.filter(pk=record.pk).update(session=None, channel_name="", disconnected_at=now, lost_at=now)
        publish_on_commit(
            agent_group(record.pk),
            {"event": "agent.close", "code": protocol.CLOSE_DELETED, "reason": "the agent's record was deleted"},
        )


# --- terminals ---------------------------------------------------------------------------------
# A terminal (PTY session) is live only: nothing of it is stored but its trail. These write the
# events that say who opened a shell on the machine, when, and how it ended (never what was typed
# or shown). The gateway's consumers call them; the relay itself is in ``consumers``.


def _user(user_id: Any) -> Any:
    from django.contrib.auth import get_user_model

    return get_user_model().objects.filter(pk=user_id).first() if user_id is not None else None


def terminal_refused(*, record_id: Any, user: records.Actor, why: str, message: str) -> None:
    """A user was refused a terminal (no permission, agent not connected): an ``error`` event."""
    username = user.get_username() if user is not None and user.is_authenticated else ""
    records.record_event_write(
        record_id,
        EventType.ERROR,
        reason="TerminalRefused",
        message=message,
        data={"user": username, "why": why},
        actor=user,
    )


def terminal_opened(
    *, record_id: Any, session: str, user_id: Any, username: str, pid: int, argv: list[str], cols: int, rows: int
) -> None:
    """The agent started the terminal's program."""
    records.record_event_write(
        record_id,
        EventType.TERMINAL,
        reason="TerminalOpened",
        message=f"{username} opened a terminal: {' '.join(argv)} (pid {pid})",
        data={"session": session, "user": username, "pid": pid, "argv": argv, "cols": cols, "rows": rows},
        actor=_user(user_id),
    )


def terminal_closed(
    *,
    record_id: Any,
    session: str,
    user_id: Any,
    username: str,
    exit_code: int | None,
    signal: int | None,
    duration_s: float,
    error: str = "",
    closed_by: str = "",
) -> None:
    """The terminal ended: its program exited (``exit_code``), or it did not start or its agent
    went away (``error``)."""
    if error:
        how = f"ended: {error}"
    elif signal:
        how = f"ended: killed by signal {signal} (exit code {exit_code})"
    else:
        how = f"ended with exit code {exit_code}"
    records.record_event_write(
        record_id,
        EventType.TERMINAL,
        reason="TerminalClosed",
        message=f"the terminal of {username} {how} after {duration_s:.1f}s",
        data={
            "session": session,
            "user": username,
            "exit_code": exit_code,
            "signal": signal,
            "duration_s": round(duration_s, 3),
            "error": error,
            "closed_by": closed_by,
        },
        actor=_user(user_id),
    )


# --- capabilities -------------------------------------------------------------------------------

CAPABILITY_NAME_MAX = 100


def needs_clean(needs: Any) -> list[dict[str, Any]]:
    """Validate needs (``graphene_sdk.need(...)`` as JSON): ``[{name, where_label, where_in}]``.

    ``where_label`` maps a capability label to the value it must have; ``where_in`` maps a
    label (or ``version``) to the values it may have.
    """
    if not isinstance(needs, list | tuple):
        raise _fail("needs", "must be a list of needs, e.g. [need('docker', where_label={'arch': 'amd64'})]")
    clean: list[dict[str, Any]] = []
    for index, item in enumerate(needs):
        where = f"needs.{index}"
        if not isinstance(item, Mapping):
            raise ValidationFailed(f"{where}: must be an object with a name", fields={where: ["not an object"]})
        unknown = sorted(set(item) - {"name", "where_label", "where_in"})
        if unknown:
            raise ValidationFailed(
                f"{where}: unknown field(s) {unknown}; a need has name, where_label, where_in",
                fields={where: [f"unknown {unknown}"]},
            )
        name = item.get("name")
        if not isinstance(name, str) or not name or len(name) > CAPABILITY_NAME_MAX:
            raise ValidationFailed(
                f"{where}.name: a capability name of 1 to {CAPABILITY_NAME_MAX} characters is required",
                fields={f"{where}.name": ["required"]},
            )
        where_label = item.get("where_label") or {}
        if not isinstance(where_label, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in where_label.items()
        ):
            raise ValidationFailed(
                f"{where}.where_label: must map label names to string values",
                fields={f"{where}.where_label": ["not a string mapping"]},
            )
        where_in = item.get("where_in") or {}
        if not isinstance(where_in, Mapping) or not all(
            isinstance(k, str) and isinstance(v, list | tuple) and v and all(isinstance(x, str) for x in v)
            for k, v in where_in.items()
        ):
            raise ValidationFailed(
                f"{where}.where_in: must map label names (or 'version') to non-empty lists of strings",
                fields={f"{where}.where_in": ["not a mapping to lists of strings"]},
            )
        clean.append(
            {
                "name": name,
                "where_label": dict(where_label),
                "where_in": {k: list(v) for k, v in where_in.items()},
            }
        )
    return clean


def capability_publish(
    *,
    agent: Record,
    name: str,
    version: str = "",
    labels: Mapping[str, str] | None = None,
    published_by: Any = None,
    actor: records.Actor = None,
) -> AgentCapability:
    """Say that ``agent``'s machine offers ``name`` (replacing what was said of it before)."""
    if agent.kind != AGENT_KIND:
        raise _fail("agent", f"{agent} is not an agent record")
    if not isinstance(name, str) or not name or len(name) > CAPABILITY_NAME_MAX or "\x00" in name:
        raise _fail("name", f"a capability name of 1 to {CAPABILITY_NAME_MAX} characters is required")
    if not isinstance(version, str) or len(version) > 100:
        raise _fail("version", "must be a string of at most 100 characters")
    labels = dict(labels or {})
    if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in labels.items()):
        raise _fail("labels", "must map non-empty label names to string values")
    with transaction.atomic():
        current = Record.objects.select_for_update(no_key=True).filter(pk=agent.pk).first()
        if current is None or _retired(current) or current.deletion_requested_at is not None:
            raise Conflict(f"agent {agent.name} ({agent.pk}) is deleted or being deleted")
        capability, created = AgentCapability.objects.update_or_create(
            agent=agent,
            name=name,
            defaults={"version": version, "labels": labels, "published_at": _now(), "published_by": published_by},
        )
        described = f"{name} {version}".strip()
        _record_event(
            agent.pk,
            EventType.NOTE,
            reason="CapabilityPublished",
            message=f"{'publishes' if created else 'updated'} capability {described}",
            data={"name": name, "version": version, "labels": labels, "run": str(published_by or "")},
        )
        _needs_settle(current)  # after the event: a phase it moves comes next
    return capability
