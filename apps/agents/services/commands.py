"""Commands: a command is a row, stored before it is sent; the socket is only delivery.

The consumer of the agent's connection is told "there is work" through the channel layer
(group ``agent.<id>``) and reads the rows. After a reconnect every open command is sent
again; the agent de-duplicates by id and answers with what it knows, so a command never runs
twice because it was re-sent. An at-most-once command whose agent vanished mid-flight
(restarted while running it, or gone past the grace period) becomes ``unknown``.

Every move of a command's status is checked against ``TRANSITIONS``; its end is one place,
``_command_finish_row``, which emits the ``CommandFinished`` domain event.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db import transaction
from graphene_agent import protocol
from graphene_sdk._secrets import secret_ref_name

from apps.agents.choices import IN_FLIGHT, OPEN, TERMINAL, TRANSITIONS, CommandKind, CommandStatus, Guarantee
from apps.agents.models import Agent, AgentCommand, AgentToken
from apps.agents.services.base import AGENT_KIND, IllegalCommandTransition, _audit, _fail, _now, agent_group
from apps.agents.services.payloads import command_payload_validate
from apps.core import access, domain
from apps.core.errors import Conflict, GrapheneError
from apps.core.events import publish_on_commit
from apps.core.validation import storable_text
from apps.observability.services import log_write_lines
from apps.records import selectors as records_selectors
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Record

logger = logging.getLogger(__name__)

MAX_TAIL_CHARS = 64 * 1024
SEALED = "$sealed"
# In a sealed exec's payload: the environment variables that hold secrets' values.
SECRET_ENV = "secret_env"  # noqa: S105 - a key of the payload, not a password
# The prefix of an ``operation`` whose submitter waits for the command in place (the docker
# kinds' HTTP requests through an agent): waking its record would only start a duplicate.
SYNC_OPERATION = "sync:"
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


# --- submit and cancel --------------------------------------------------------------------------


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
    resolve_secrets: bool = False,
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
    ``resolve_secrets``: an exec's ``env`` may hold secret references (``{"$secret": name}``,
    ``ctx.secret`` in a pipeline): their values are read from the secret store here, at the
    point of use, and the payload is sealed; what the program prints is stored with those
    values masked (``secrets_mask``). For the pipelines' commands only: the right to
    run commands is not the right to read secrets, so the API never sets it.
    """
    access.require_actor(actor, "exec", "agents", agent.namespace)
    if agent.kind != AGENT_KIND:
        raise _fail("agent", f"{agent} is not an agent record")
    if guarantee not in Guarantee.values:
        raise _fail("guarantee", f"unknown guarantee {guarantee!r}; guarantees are {Guarantee.values}")
    secret_env: list[str] = []
    if resolve_secrets and kind == CommandKind.EXEC:
        payload, secret_env = _env_secrets_resolved(payload, namespace=agent.namespace)
        sealed = sealed or bool(secret_env)
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
            payload=_seal(command_id, clean, secret_env=secret_env) if sealed else clean,
            operation=operation[:40],
            guarantee=guarantee,
            log_record_ids=extra_logs,
            waiting_record_id=waiting_record,
            requested_by_id=actor.pk if actor is not None and actor.is_authenticated else None,
            created_at=_now(),
        )
        if waiting_record is None:
            # A kind's own operation on the machine (for a record's convergence or deletion) is
            # covered by that record's rows; what a user or a run asks for is a row of its own.
            _audit(
                "agent.command_submit",
                agent,
                actor=actor,
                after=_command_audited(command),
                object_id=command.pk,
                object_name=f"{agent.name}: {kind}",
                on_agent=agent.pk,
                kind=kind,
            )
        publish_on_commit(agent_group(agent.pk), {"event": "agent.commands"})
    return command


def _command_audited(command: AgentCommand) -> dict[str, Any]:
    """What the audit trail's digests cover of a command: not its payload, which may carry an
    environment's values (or, sealed, a secret's)."""
    return {
        "id": command.pk,
        "agent": command.agent_id,
        "kind": command.kind,
        "guarantee": command.guarantee,
        "operation": command.operation,
        "status": command.status,
        "cancel_requested_at": command.cancel_requested_at,
    }


def command_cancel(*, command: AgentCommand, actor: records.Actor = None) -> AgentCommand:
    """Cancel: a queued command never goes out; a sent or running one is killed on the agent."""
    access.require_actor(actor, "exec", "agents", command.agent.namespace)
    agent = command.agent
    with transaction.atomic():
        command = AgentCommand.objects.select_for_update(no_key=True).get(pk=command.pk)
        if command.status in TERMINAL:
            return command
        before = _command_audited(command)
        if command.status == CommandStatus.QUEUED:
            _command_finish_row(command, CommandStatus.CANCELLED, error="cancelled before it was sent")
        else:
            if command.cancel_requested_at is None:
                command.cancel_requested_at = _now()
                AgentCommand.objects.filter(pk=command.pk).update(cancel_requested_at=command.cancel_requested_at)
            publish_on_commit(agent_group(command.agent_id), {"event": "agent.commands"})
        if command.waiting_record_id is None:  # as at its submit: a kind's own is not a row
            _audit(
                "agent.command_cancel",
                agent,
                actor=actor,
                before=before,
                after=_command_audited(command),
                object_id=command.pk,
                object_name=f"{agent.name}: {command.kind}",
                on_agent=agent.pk,
            )
    return command


# --- delivery and results (called by the gateway consumer) ------------------------------------


def _env_secrets_resolved(payload: Mapping[str, Any], *, namespace: str) -> tuple[Mapping[str, Any], list[str]]:
    """The payload with each secret reference in its ``env`` replaced by the secret's value
    (``SecretNotFound`` names a missing one), and the variables that hold one."""
    from apps.secrets.services import secret_resolve

    env = payload.get("env")
    if not isinstance(env, Mapping):
        return payload, []
    names = {key: secret_ref_name(value) for key, value in env.items()}
    if not any(names.values()):
        return payload, []
    resolved = {
        key: secret_resolve(name=name, namespace=namespace) if name is not None else value
        for (key, value), name in zip(env.items(), names.values(), strict=True)
    }
    return {**payload, "env": resolved}, sorted(str(key) for key, name in names.items() if name is not None)


def _seal(command_id: uuid.UUID, payload: dict[str, Any], *, secret_env: Sequence[str] = ()) -> dict[str, Any]:
    """The payload encrypted (bound to the command's id); only a function's name and an exec's
    argv stay readable (what the command is, for the Studio, the API and its trace span), and
    the names of the environment variables that hold secrets (``SECRET_ENV``: whose values
    are masked in what the program prints)."""
    from apps.secrets.crypto import encrypt

    ciphertext, _key = encrypt(namespace="agent-command", name=str(command_id), value=json.dumps(payload))
    visible = {key: payload[key] for key in ("name", "argv") if key in payload}
    if secret_env:
        visible[SECRET_ENV] = list(secret_env)
    return {SEALED: ciphertext, **visible}


def _printed_secrets(command: AgentCommand) -> list[str]:
    """The secrets' values a command's program was given (its sealed ``env``), to be masked
    in what it prints; none for a command that was given none."""
    payload = command.payload
    names = payload.get(SECRET_ENV) if isinstance(payload, dict) and SEALED in payload else None
    if not names:
        return []
    env = _unsealed(command).get("env") or {}
    return [str(env[name]) for name in names if isinstance(env.get(name), str)]


def _masked(text: str, values: Sequence[str], *, is_tail: bool = False) -> str:
    from apps.secrets.services import secrets_mask

    return secrets_mask(text, values=values, is_tail=is_tail) if values else text


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


def _command_locked(record_id: Any, command_id: Any) -> AgentCommand | None:
    """The command row the agent names, locked; ``None`` if it is not that agent's (or purged)."""
    return AgentCommand.objects.select_for_update(no_key=True).filter(pk=command_id, agent_id=record_id).first()


def command_accepted(*, record_id: Any, command_id: Any) -> None:
    """The agent started the command (or re-attached to it after a reconnect)."""
    with transaction.atomic():
        command = _command_locked(record_id, command_id)
        if command is None or command.status != CommandStatus.SENT:
            return
        _command_transition(command, CommandStatus.RUNNING)
        AgentCommand.objects.filter(pk=command.pk).update(status=command.status, started_at=_now())


def command_output(*, record_id: Any, command_id: Any, seq: int, stream: str, data: str) -> int:
    """Store an output chunk as log lines, once; returns the sequence number to acknowledge."""
    with transaction.atomic():
        command = _command_locked(record_id, command_id)
        if command is None:
            return seq  # not ours (or purged): let the agent forget it
        if seq <= command.output_seq:
            return command.output_seq  # a chunk re-sent after a reconnect: already stored
        lines = data.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        secrets = _printed_secrets(command)
        if secrets:  # a program given secrets may print them: its lines are stored masked (I7)
            lines = _masked("\n".join(lines), secrets).split("\n")
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


def logs_beyond_subtree(*, agent_id: Any, record_ids: Sequence[Any]) -> list[Any]:
    """The records, of ``record_ids``, whose logs need a copy of the agent's lines: those that
    do not own the agent. A record's log shows its subtree's lines, so an owner (the run that
    declared the agent) reads them on the agent's record, and a copy would show each twice;
    a run that attached another's agent gets its copy."""
    owners = records_selectors.owners_among(record_id=agent_id, candidates=[str(r) for r in record_ids])
    return [r for r in record_ids if str(r) not in owners]


def _log_lines(command: AgentCommand, lines: Sequence[str], *, stream: str) -> None:
    """The bulk form of ``observability.services.log_write`` (same fields, one statement per chunk).

    A chunk carries many lines; one statement per chunk instead of per line is what lets an
    agent stream tens of thousands of lines a second. The lines go to the agent's record and
    to the ``log_to`` records that do not own it (``logs_beyond_subtree``), looked up per
    chunk: ownership may change while a command runs.
    """
    log_write_lines(
        record_ids=[
            command.agent_id,
            *logs_beyond_subtree(agent_id=command.agent_id, record_ids=command.log_record_ids),
        ],
        lines=lines,
        stream=stream,
        source=f"command/{command.pk}",
        at=_now(),
    )


def command_finish(*, record_id: Any, command_id: Any, result: Mapping[str, Any]) -> AgentCommand | None:
    """The agent's result for a command; stored once (a replayed result of a finished command is ignored)."""
    with transaction.atomic():
        command = _command_locked(record_id, command_id)
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
        # What a program given secrets printed is stored with their values masked (I7); a tail
        # may begin in the middle of one.
        secrets = _printed_secrets(command)
        extra = {
            key: _masked(result[key], secrets) if isinstance(result[key], str) else result[key]
            for key in RESULT_KEYS
            if key in result
        }
        if int(result.get("output_seq") or 0) > command.output_seq:
            extra["output_incomplete"] = True
        stdout_tail = str(result.get("stdout_tail") or "")[-MAX_TAIL_CHARS:]
        stderr_tail = str(result.get("stderr_tail") or "")[-MAX_TAIL_CHARS:]
        _command_finish_row(
            command,
            CommandStatus(status),
            error=storable_text(_masked(error, secrets)),
            exit_code=exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None,
            # A program's output may hold NUL (and a broken agent lone surrogates): stored as
            # U+FFFD, as its log lines are, or the result could never be stored.
            stdout_tail=storable_text(_masked(stdout_tail, secrets, is_tail=True)),
            stderr_tail=storable_text(_masked(stderr_tail, secrets, is_tail=True)),
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


# --- an agent that goes: its open commands end ----------------------------------------------


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


def _commands_vanished(record_id: Any, why: str) -> None:
    """At-most-once commands the agent may have been running: their outcome is unknown."""
    rows = AgentCommand.objects.select_for_update(no_key=True).filter(
        agent_id=record_id, guarantee=Guarantee.AT_MOST_ONCE, status__in=sorted(IN_FLIGHT)
    )
    for command in rows:
        _command_finish_row(command, CommandStatus.UNKNOWN, error=why)
