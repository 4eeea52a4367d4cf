"""The runtime's calls on agents' machines: declaring, attaching and selecting agents,
publishing capabilities, installing over SSH, and commands (exec, files, functions).

Every command is one journaled call (``_agent_command``): the command row and the journal
entry commit together, the run suspends until the command has finished, and a replay returns
what the journal holds or waits on the same command, so nothing is sent twice.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from graphene_sdk import OutcomeUnknown, RemoteError, ResourceFailed
from graphene_sdk._remote import RemoteCall
from graphene_sdk._runtime import Guarantee

from apps.agents import selectors as agent_selectors
from apps.agents import services as agents
from apps.agents import ssh_install
from apps.agents.choices import CommandKind, CommandStatus
from apps.agents.models import AgentCommand
from apps.core.errors import GrapheneError as ServiceError
from apps.pipelines.choices import EntryStatus
from apps.pipelines.engine.journal import _Suspend, result_of
from apps.pipelines.engine.records import READY_PHASES
from apps.pipelines.engine.state import ExecutionState
from apps.pipelines.models import Run
from apps.records.choices import Phase
from apps.records.models import Record


class _CommandFailed(Exception):
    """A finished agent command that did not do what was asked (``remote``: what a function raised)."""

    def __init__(self, message: str, *, remote: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.remote = remote


def _command_succeeded(command: AgentCommand, what: str) -> None:
    if command.status != CommandStatus.SUCCEEDED:
        raise _CommandFailed(f"{what} failed: {command.error or command.status}")


def _command_error(message: str, info: Mapping[str, Any], record_id: str) -> ResourceFailed | RemoteError:
    """The error a failed command's journal entry stands for, the same on every replay."""
    remote = info.get("remote")
    if isinstance(remote, Mapping):
        return RemoteError(
            message,
            function=str(remote.get("function", "")),
            remote_type=str(remote.get("type", "")),
            remote_message=str(remote.get("message", "")),
            remote_traceback=str(remote.get("traceback", "")),
            record_id=record_id,
        )
    return ResourceFailed(message, record_id=record_id)


class AgentCalls(ExecutionState):
    def agent(self, name: str, labels: Mapping[str, str], needs: list[dict[str, Any]]) -> str:
        call = f"agent {name}"
        entry = self.journal.next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error)
            return str(result_of(entry)["record_id"])

        def do(run: Run) -> str:
            # The install data holds a bootstrap token: it is never journaled (I7);
            # install_env()/install_script() issue a fresh single-use token when asked.
            return str(
                agents.agent_declare(owner=self.owner(None, run), name=name, labels=dict(labels), needs=needs).record.pk
            )

        return self.journal.act(
            self.journal.seq, call, do, lambda pk: {"record_id": pk}, refused=f"cannot declare agent {name}"
        )

    def agent_install(self, record_id: str, form: str) -> str:
        record = Record.objects.get(pk=record_id)
        token = agents.agent_bootstrap_issue(record=record)
        if form == "env":
            return agents.agent_env_file(record=record, bootstrap_token=token)
        return agents.agent_install_script(record=record, bootstrap_token=token)

    def machine(self, record_id: str, run: Run) -> Record:
        """An agent this run owns, or one it attached or selected (commands may run on both)."""
        if record_id in self.attached_agents:
            record = Record.objects.filter(pk=record_id, kind="agent").first()
            if record is None:
                raise ResourceFailed(f"agent {record_id} does not exist any more")
            return record
        return self.owned(record_id, run)

    def attach_agent(self, name_or_id: str, needs: list[dict[str, Any]]) -> dict[str, Any]:
        call = f"attach_agent {name_or_id}"
        entry = self.journal.next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error)
            self.attached_agents.add(str(result_of(entry)["record_id"]))
            return result_of(entry)
        failure = ""
        try:
            clean = agents.needs_clean(needs)
            found = agent_selectors.agent_find(name_or_id=name_or_id, namespace=self.run.namespace)
            if not found:
                failure = f"cannot attach agent {name_or_id}: no live agent has that name or id"
            elif len(found) > 1:
                ids = ", ".join(str(r.pk) for r in found)
                failure = f"cannot attach agent {name_or_id}: {len(found)} live agents have that name; use an id: {ids}"
            else:
                unmet = agent_selectors.agent_needs_unmet(agent=found[0], needs=clean)
                if unmet:
                    failure = f"cannot attach agent {name_or_id}: it {'; it '.join(unmet)}"
        except ServiceError as exc:
            failure = f"cannot attach agent {name_or_id}: {exc.detail}"
        if failure:
            raise self.journal.refuse(self.journal.seq, call, failure)
        result = {"record_id": str(found[0].pk), "name": found[0].name}
        self.journal.write(self.journal.seq, call, EntryStatus.COMPLETED, result)
        self.attached_agents.add(result["record_id"])
        return result

    def select_agents(self, labels: Mapping[str, str], needs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        call = "select_agents"
        entry = self.journal.next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error)
            chosen: list[dict[str, Any]] = result_of(entry)["agents"]
            self.attached_agents.update(str(a["record_id"]) for a in chosen)
            return chosen
        try:
            clean = agents.needs_clean(needs)
        except ServiceError as exc:
            raise self.journal.refuse(self.journal.seq, call, f"cannot select agents: {exc.detail}") from None
        found = agent_selectors.agents_select(labels=dict(labels), needs=clean, namespace=self.run.namespace)
        chosen = [{"record_id": str(r.pk), "name": r.name} for r in found]
        self.journal.write(self.journal.seq, call, EntryStatus.COMPLETED, {"agents": chosen})
        self.attached_agents.update(a["record_id"] for a in chosen)
        return chosen

    def publish_capability(
        self, record_id: str, label: str, name: str, version: str, labels: Mapping[str, str]
    ) -> None:
        call = f"publish_capability {label} {name}"
        entry = self.journal.next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error, record_id=record_id)
            return

        def do(run: Run) -> None:  # the capability and its journal entry commit together
            agents.capability_publish(
                agent=self.machine(record_id, run),
                name=name,
                version=version,
                labels=dict(labels),
                published_by=run.record_id,
            )

        self.journal.act(
            self.journal.seq,
            call,
            do,
            lambda _: {"name": name, "version": version},
            refused=f"cannot publish {name} on {label}",
            record_id=record_id,
        )

    def agent_via_ssh(self, name: str, labels: Mapping[str, str], target: Mapping[str, Any]) -> str:
        """Declare an agent record, install the agent over SSH, wait until it has connected.

        One journal entry carries the whole call. It is written ``started`` with the record
        (one transaction, I1) before anything touches the machine, and holds only names and
        public data: the target, the key's *secret name*, the host key's fingerprint (I7).
        The install itself is an at-least-once, idempotent operation (``ssh_install``): a
        replay after a crash runs it again and it finds the agent running, so nothing is
        installed twice. Once it has succeeded the entry notes so and the run suspends until
        the record is ready (the agent said hello) or the connect deadline passes. An
        unreachable host is retried on durable timers; a host key mismatch, a refused key or
        a missing secret fail the call at once.
        """
        call = f"agent_via_ssh {name}"
        entry = self.journal.next(call)
        seq = self.journal.seq
        label = f"agent/{name}"
        if entry is not None and entry.status == EntryStatus.COMPLETED:
            return str(result_of(entry)["record_id"])
        if entry is not None and entry.status == EntryStatus.FAILED:
            raise ResourceFailed(entry.error, record_id=str((entry.result or {}).get("record_id", "")))
        ssh = ssh_install.SSHTarget.from_call(target)
        if entry is None:
            try:
                described = ssh.describe()
            except ssh_install.SSHInstallError as exc:
                with transaction.atomic():
                    self.journal.fence()
                    error = self.journal.refuse(seq, call, f"cannot install {label} over SSH: {exc.detail}")
                raise error from None
            self.journal.act(  # the record and its journal entry commit together (I1)
                seq,
                call,
                lambda run: agents.agent_record_declare(owner=self.owner(None, run), name=name, labels=dict(labels)),
                lambda record: {"record_id": str(record.pk), "target": described, "attempts": 0},
                refused=f"cannot declare {label}",
                status=EntryStatus.STARTED,
            )
        state = dict(result_of(self.journal.entries[seq]))
        record_id = str(state["record_id"])

        def fail(message: str) -> ResourceFailed:
            self.journal.write(seq, call, EntryStatus.FAILED, {"record_id": record_id}, message)
            return ResourceFailed(message, record_id=record_id)

        def connected_or_gone() -> bool:
            return (
                Record.objects.filter(pk=record_id)
                .filter(Q(phase__in=READY_PHASES) | Q(deletion_requested_at__isnull=False) | Q(phase=Phase.DELETED))
                .exists()
            )

        def current() -> Record:
            record = Record.objects.filter(pk=record_id).first()
            if record is None or record.phase == Phase.DELETED or record.deletion_requested_at is not None:
                raise fail(f"{label} was deleted before its agent connected")
            return record

        record = current()
        if not state.get("installed_at") and record.phase not in READY_PHASES:
            self.journal.fence(lock=False)  # a worker that lost the run must not touch the machine
            try:
                log_to = [self.run.record_id] if self.run.record_id is not None else []
                outcome = ssh_install.agent_ssh_install(record=record, target=ssh, log_to=log_to)
            except ssh_install.SSHInstallError as exc:
                attempts = int(state.get("attempts", 0)) + 1
                if not exc.transient or attempts >= settings.GRAPHENE_AGENT_SSH_ATTEMPTS:
                    tries = f" (after {attempts} attempts)" if exc.transient else ""
                    raise fail(f"cannot install {label} over SSH{tries}: {exc.detail}") from None
                delay = min(
                    settings.GRAPHENE_RETRY_BASE_SECONDS * 2 ** (attempts - 1), settings.GRAPHENE_RETRY_MAX_SECONDS
                )
                state.update(attempts=attempts, last_error=exc.detail)
                self.journal.write(seq, call, EntryStatus.STARTED, state)
                raise _Suspend(wake_at=timezone.now() + timedelta(seconds=delay)) from None
            except ServiceError as exc:  # e.g. the record began deletion while we installed
                raise fail(f"cannot install {label} over SSH: {exc.detail}") from None
            state.update(installed_at=timezone.now().isoformat(), install=outcome.as_dict())
            self.journal.write(seq, call, EntryStatus.STARTED, state)
            record = current()
        if record.phase in READY_PHASES:
            self.journal.write(
                seq, call, EntryStatus.COMPLETED, {"record_id": record_id, "install": state.get("install")}
            )
            return record_id
        installed_at = parse_datetime(str(state["installed_at"]))
        assert installed_at is not None
        deadline = installed_at + timedelta(seconds=settings.GRAPHENE_AGENT_SSH_CONNECT_TIMEOUT_SECONDS)
        if timezone.now() >= deadline:
            where = (state.get("install") or {}).get("directory") or "~/.graphene-agent"
            raise fail(
                f"{label} was installed over SSH on {ssh.address} but did not connect within "
                f"{settings.GRAPHENE_AGENT_SSH_CONNECT_TIMEOUT_SECONDS}s; see {where}/agent.log on that machine "
                f"(is {settings.GRAPHENE_AGENT_SERVER_URL} reachable from it?)"
            )
        raise _Suspend(waiting_on=[record_id], wake_at=deadline, until=connected_or_gone)

    def agent_exec(
        self,
        record_id: str,
        label: str,
        argv: Sequence[str],
        env: Mapping[str, str | Mapping[str, str]],
        cwd: str | None,
        timeout: float | None,
        guarantee: Guarantee,
    ) -> dict[str, Any]:
        def payload() -> dict[str, Any]:
            built: dict[str, Any] = {"argv": list(argv), "env": dict(env)}
            if cwd is not None:
                built["cwd"] = cwd
            if timeout is not None:
                built["timeout"] = timeout
            return built

        def outcome(command: AgentCommand) -> dict[str, Any]:
            if command.exit_code is None:  # a non-zero exit is a result; not running at all is not
                raise _CommandFailed(f"{argv[0]} on {label} did not run: {command.status}")
            return {
                "exit_code": command.exit_code,
                "stdout_tail": command.stdout_tail,
                "stderr_tail": command.stderr_tail,
            }

        return self._agent_command(
            call=f"exec {label} {argv[0]}",
            record_id=record_id,
            label=label,
            what=f"{argv[0]} on {label}",
            kind=CommandKind.EXEC,
            payload=payload,
            guarantee=guarantee,
            outcome=outcome,
            resolve_secrets=True,  # env values may be ctx.secret(...) references, as a Docker job's
        )

    def agent_put_file(self, record_id: str, label: str, path: str, data: bytes, mode: int) -> dict[str, Any]:
        """The content travels in the command row (until delivered), never in the journal:
        the entry keeps the command's id and the size and SHA-256 the machine reported."""

        def outcome(command: AgentCommand) -> dict[str, Any]:
            _command_succeeded(command, f"put_file {path} on {label}")
            return {"size": command.result.get("size"), "sha256": command.result.get("sha256")}

        return self._agent_command(
            call=f"put_file {label} {path}",
            record_id=record_id,
            label=label,
            what=f"put_file {path} on {label}",
            kind=CommandKind.PUT_FILE,
            payload=lambda: {"path": path, "data": base64.b64encode(data).decode(), "mode": mode},
            guarantee="at_least_once",  # an atomic replace with the same content: repeating it is harmless
            outcome=outcome,
        )

    def agent_get_file(self, record_id: str, label: str, path: str, max_bytes: int) -> bytes:
        """The journal keeps the command's id, size and SHA-256; the content stays in the
        command's result, where a replay reads it again (and checks it against the digest)."""
        what = f"get_file {path} on {label}"

        def outcome(command: AgentCommand) -> dict[str, Any]:
            _command_succeeded(command, what)
            return {"size": command.result.get("size"), "sha256": command.result.get("sha256")}

        payload = {"path": path, "max_bytes": max_bytes}
        result = self._agent_command(
            call=f"get_file {label} {path}",
            record_id=record_id,
            label=label,
            what=what,
            kind=CommandKind.GET_FILE,
            payload=lambda: payload,
            guarantee="at_least_once",
            outcome=outcome,
        )
        command = AgentCommand.objects.filter(pk=result["command"]).only("result").first()
        encoded = (command.result if command is not None else {}).get("data")
        data = base64.b64decode(encoded) if isinstance(encoded, str) else None
        if data is None or hashlib.sha256(data).hexdigest() != result["sha256"]:
            raise ResourceFailed(
                f"{what}: the content read by command {result['command']} is no longer stored", record_id=record_id
            )
        return data

    def agent_call(
        self, record_id: str, label: str, call: RemoteCall, timeout: float | None, guarantee: Guarantee
    ) -> Any:
        """The journal keeps the function's JSON value (or what it raised there), like a step's."""
        what = f"{call.name}() on {label}"

        def outcome(command: AgentCommand) -> dict[str, Any]:
            result = command.result or {}
            if command.status == CommandStatus.SUCCEEDED and "value" in result:
                return {"value": result["value"]}
            if command.status == CommandStatus.FAILED and "error_type" in result:
                remote = {
                    "function": call.name,
                    "type": str(result["error_type"]),
                    "message": str(result.get("error_message", "")),
                    "traceback": str(result.get("traceback", "")),
                }
                raise _CommandFailed(f"{what} raised {remote['type']}: {remote['message']}", remote=remote)
            raise _CommandFailed(f"{what} did not return: {command.error or command.status}")

        payload: dict[str, Any] = {"name": call.name, "source": call.source, "args": call.args, "kwargs": call.kwargs}
        if timeout is not None:
            payload["timeout"] = timeout
        result = self._agent_command(
            call=f"call {label} {call.name}",
            record_id=record_id,
            label=label,
            what=what,
            kind=CommandKind.CALL,
            payload=lambda: payload,
            guarantee=guarantee,
            outcome=outcome,
        )
        return result["value"]

    def _agent_command(
        self,
        *,
        call: str,
        record_id: str,
        label: str,
        what: str,
        kind: str,
        payload: Callable[[], dict[str, Any]],
        guarantee: Guarantee,
        outcome: Callable[[AgentCommand], dict[str, Any]],
        resolve_secrets: bool = False,
    ) -> dict[str, Any]:
        """One command on an agent's machine as one journaled call (every command kind).

        The command row and the journal entry (``started``, holding the command's id) commit
        in one transaction; the run suspends until the command has finished; ``outcome`` turns
        the finished row into the journaled result (or raises ``_CommandFailed``). A replay
        returns what the journal holds, or waits on the same command: nothing is sent twice.
        An at-most-once command whose agent vanished is ``OutcomeUnknown``; a command that
        failed is ``ResourceFailed`` (``RemoteError`` for a function that raised there).
        """
        entry = self.journal.next(call)
        seq = self.journal.seq
        if entry is not None and entry.status == EntryStatus.COMPLETED:
            return result_of(entry)
        if entry is not None and entry.status == EntryStatus.UNKNOWN:
            raise OutcomeUnknown(entry.error, step=call)
        if entry is not None and entry.status == EntryStatus.FAILED:
            raise _command_error(entry.error, entry.result or {}, record_id)
        if entry is None:

            def submit(run: Run) -> str:  # the command row and its journal entry commit together
                command = agents.command_submit(
                    agent=self.machine(record_id, run),
                    kind=kind,
                    payload=payload(),
                    guarantee=guarantee,
                    log_to=[run.record_id],
                    resolve_secrets=resolve_secrets,
                )
                return str(command.pk)

            command_id = self.journal.act(
                seq,
                call,
                submit,
                lambda pk: {"command": pk},
                refused=f"cannot run {what}",
                status=EntryStatus.STARTED,
                record_id=record_id,
            )
        else:
            command_id = str(result_of(entry)["command"])
        command = agent_selectors.command_get(command_id=command_id, with_payload=False)
        if not command.is_finished:
            raise _Suspend(waiting_on=[command_id])
        if command.status == CommandStatus.UNKNOWN:
            message = f"{what} (at most once) was interrupted; it may or may not have run"
            self.journal.write(seq, call, EntryStatus.UNKNOWN, {"command": command_id}, message)
            raise OutcomeUnknown(message, step=call)
        try:
            result = {"command": command_id, **outcome(command)}
        except _CommandFailed as failed:
            info: dict[str, Any] = {"command": command_id}
            if failed.remote is not None:
                info["remote"] = failed.remote
            self.journal.write(seq, call, EntryStatus.FAILED, info, failed.message)
            raise _command_error(failed.message, info, record_id) from None
        self.journal.write(seq, call, EntryStatus.COMPLETED, result)
        return result
