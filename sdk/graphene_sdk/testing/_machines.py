"""The world's machines: agents, what their ``exec`` and ``agent.run`` answer, their files
and the capabilities they publish. Nothing runs on a real machine."""

from __future__ import annotations

import hashlib
import json
import linecache
import traceback
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from graphene_sdk._errors import RemoteError, ResourceFailed
from graphene_sdk._remote import MAX_CALL_RESULT_BYTES, RemoteCall
from graphene_sdk.testing._records import RecordRules
from graphene_sdk.testing._results import Record

ExecFn = Callable[[str, list[str]], tuple[int, str, str]]
# ``handler(agent_name, function_name, args, kwargs) -> value`` (see ``World.on_call``).
CallFn = Callable[[str, str, list[Any], dict[str, Any]], Any]


def run_source(call: RemoteCall) -> Any:
    """What the machine does with an ``Agent.run`` call, in this process: the function's source
    alone, compiled with postponed annotations in a fresh module namespace, called with the
    JSON arguments. So a function that leans on its module fails here as it would there."""
    import __future__

    namespace: dict[str, Any] = {"__name__": "graphene_call", "__builtins__": __builtins__}
    filename = f"<agent.run {call.name}>"
    linecache.cache[filename] = (len(call.source), None, call.source.splitlines(True), filename)
    code = compile(call.source, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)  # noqa: S102 - the pipeline's own function, as the agent would run it
    return namespace[call.name](*call.args, **call.kwargs)


class Machines(RecordRules):
    """The machine side of ``World``: its handlers, agents, files, calls and capabilities."""

    def __init__(self, now: datetime) -> None:
        super().__init__(now)
        self._exec: ExecFn = lambda agent, argv: (0, "", "")
        self.commands: list[tuple[str, list[str]]] = []
        # What ``agent.put_file`` wrote, per agent name and path (``agent.get_file`` reads it).
        self.files: dict[str, dict[str, bytes]] = {}
        # ``agent.run`` calls as (agent name, function name, args, kwargs), JSON as sent.
        self.calls: list[tuple[str, str, list[Any], dict[str, Any]]] = []
        self._call: CallFn | None = None
        # ``ctx.agent_via_ssh`` calls as (agent name, target): host, port, user, the key's
        # secret name and the pinned host key. Nothing is installed in the world.
        self.ssh_installs: list[tuple[str, dict[str, Any]]] = []
        # What agents' machines offer, per agent record id: capability name -> (version, labels)
        # (``ctx.publish_capability``, ``World.add_agent``; matched by ``need(...)``).
        self.capabilities: dict[str, dict[str, tuple[str, dict[str, str]]]] = {}

    # --- configuration -----------------------------------------------------------------------

    def on_exec(self, handler: ExecFn) -> None:
        """How agents answer ``agent.exec``: ``handler(agent_name, argv) -> (exit, stdout, stderr)``.

        Every command is also recorded in ``world.commands`` as ``(agent_name, argv)``.
        """
        self._exec = handler

    def add_agent(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        capabilities: Mapping[str, tuple[str, Mapping[str, str]]] | None = None,
    ) -> Record:
        """A machine that exists before any run (for ``ctx.attach_agent``/``ctx.select_agents``):
        a ready agent record held by the stand ``stand:machines``. ``capabilities`` maps a
        capability name to ``(version, labels)``, as ``ctx.publish_capability`` would publish it."""
        if not name:
            raise ValueError("an agent needs a name")
        record = self._insert(
            kind="agent", name=name, spec={}, labels=dict(labels or {}), owner="stand:machines", declared_by=""
        )
        record.phase = "ready"
        record.outputs = {"id": record.id, "kind": "agent", "name": name}
        self.capabilities[record.id] = {k: (v, dict(ls)) for k, (v, ls) in (capabilities or {}).items()}
        return record

    def on_call(self, handler: CallFn) -> None:
        """How agents answer ``agent.run``: ``handler(agent_name, function_name, args, kwargs) -> value``.

        An exception the handler raises is what the function raised on the machine: the run
        sees ``RemoteError`` with its type and message. Without a handler the function's source
        runs here, in this process, as the machine would run it (a fresh namespace: it must
        import what it needs in its body); it sees this machine's files, not ``world.files``.
        Every call is recorded in ``world.calls``.
        """
        self._call = handler

    # --- what the machines do when a run acts on them (the runtime has checked the run) ------

    def _unmet(self, record: Record, needs: list[dict[str, Any]]) -> list[str]:
        """The needs (JSON, as ``need(...).to_json()``) that ``record``'s capabilities do not meet."""
        offered = self.capabilities.get(record.id, {})
        unmet = []
        for item in needs:
            found = offered.get(item["name"])
            values = {**found[1], "version": found[0]} if found is not None else {}
            ok = found is not None and all(values.get(k) == v for k, v in item["where_label"].items())
            ok = ok and all(values.get(k) in allowed for k, allowed in item["where_in"].items())
            if not ok:
                if found is None:
                    published = ", ".join(f"{n} {v[0]}".strip() for n, v in sorted(offered.items())) or "nothing"
                    unmet.append(f"{item['name']} (it publishes {published})")
                else:
                    unmet.append(f"{item['name']} (it publishes {values})")
        return unmet

    def _attach(self, name_or_id: str, needs: list[dict[str, Any]]) -> Record:
        """The one live agent with this name or id, if it meets ``needs`` (``ctx.attach_agent``)."""
        found = [r for r in self._live("agent") if name_or_id in (r.id, r.name)]
        if not found:
            raise ResourceFailed(f"cannot attach agent {name_or_id}: no live agent has that name or id")
        if len(found) > 1:
            raise ResourceFailed(f"cannot attach agent {name_or_id}: {len(found)} agents have that name; pass the id")
        unmet = self._unmet(found[0], needs)
        if unmet:
            raise ResourceFailed(f"cannot attach agent {name_or_id}: it does not meet the needs {unmet}")
        return found[0]

    def _select(self, labels: Mapping[str, str], needs: list[dict[str, Any]]) -> list[Record]:
        """The live agents with these labels that meet ``needs``, by name (``ctx.select_agents``)."""
        chosen = [
            r
            for r in self._live("agent")
            if all(r.labels.get(k) == v for k, v in labels.items()) and not self._unmet(r, needs)
        ]
        return sorted(chosen, key=lambda r: (r.name, r.id))

    def _run_command(self, record: Record, argv: Sequence[str]) -> dict[str, Any]:
        self.commands.append((record.name, list(argv)))
        exit_code, stdout, stderr = self._exec(record.name, list(argv))
        return {"exit_code": exit_code, "stdout_tail": stdout, "stderr_tail": stderr}

    def _put_file(self, record: Record, path: str, data: bytes) -> dict[str, Any]:
        self.files.setdefault(record.name, {})[path] = bytes(data)
        return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def _get_file(self, record: Record, label: str, path: str, max_bytes: int) -> bytes:
        data = self.files.get(record.name, {}).get(path)
        if data is None:
            raise ResourceFailed(
                f"get_file {path} on {label} failed: cannot read {path}: No such file or directory "
                "(the world's machines hold only what put_file wrote)",
                record_id=record.id,
            )
        if len(data) > max_bytes:
            raise ResourceFailed(
                f"get_file {path} on {label} failed: {path} is {len(data)} bytes; get_file returns at most {max_bytes}",
                record_id=record.id,
            )
        return data

    def _run_call(self, record: Record, label: str, call: RemoteCall) -> Any:
        self.calls.append((record.name, call.name, list(call.args), dict(call.kwargs)))
        handler = self._call
        try:
            value = handler(record.name, call.name, call.args, call.kwargs) if handler else run_source(call)
        except Exception as exc:
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:  # the world's own frames
                tb = tb.tb_next
            remote_traceback = "".join(traceback.format_exception(type(exc), exc, tb))
            raise _remote_error(record.id, label, call, type(exc).__name__, str(exc), remote_traceback) from exc
        try:
            encoded = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            message = f"the result of {call.name}() is not JSON-serializable: {exc}"
            raise _remote_error(record.id, label, call, "TypeError", message, "") from None
        if len(encoded.encode()) > MAX_CALL_RESULT_BYTES:
            message = (
                f"the result is {len(encoded.encode())} bytes of JSON; a call returns at most {MAX_CALL_RESULT_BYTES}"
            )
            raise _remote_error(record.id, label, call, "ValueError", message, "")
        return json.loads(encoded)


def _remote_error(
    record_id: str, label: str, call: RemoteCall, kind: str, message: str, remote_traceback: str
) -> RemoteError:
    return RemoteError(
        f"{call.name}() on {label} raised {kind}: {message}",
        function=call.name,
        remote_type=kind,
        remote_message=message,
        remote_traceback=remote_traceback,
        record_id=record_id,
    )
