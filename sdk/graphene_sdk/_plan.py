"""A plan: what a run of a pipeline would do, recorded without doing it.

The pipeline's function runs once against the testing kit's world (``graphene_sdk.testing``:
its ownership rules refuse what the engine would refuse) in a recording mode: nothing
converges, no step's function is called, no command reaches a machine, no child run's records
exist. Each call the run would make is an entry, in order: declarations (kind, name, owner,
spec with secret names only), waits on records, steps, child runs, agent calls (exec,
put_file, get_file, run), stand handovers, sleeps, log lines. Where a run would read a value
from outside it gets a placeholder (``graphene_sdk._placeholder``) that names its source.

Decisions:

* **Child runs are planned too**, nested: a child's declarations, steps and commands are part
  of what the run brings about (it owns the child), so the plan follows ``ctx.run``/``run_all``
  into the child's code (the ``Pipeline`` object the parent passes, as the parent's module
  sees it) and records them under the child's ref; the child's output is a placeholder.
* **The plan is the path on which everything succeeds**: records become ready, steps return,
  commands exit 0 (``ExecResult.ok``), child runs succeed. A placeholder is *true* where user
  code asks (noted as an ``assume`` entry with its line); anything else that needs its value
  (a comparison, a length, a number) stops the plan there: the answer is the plan so far,
  ``complete: false`` and ``stopped`` naming the placeholder and the line. So does an
  exception that carries a placeholder in its message (``int("<step n: result>")``, a
  model's validation of one), and a plan longer than ``MAX_ENTRIES`` (a loop without end).
  Any other exception is the pipeline failing: ``PlanFailed`` with its traceback.
* ``ctx.select_agents`` finds one machine in a plan, standing for each one a run would find.

``python -I -m graphene_sdk._plan`` reads a request (JSON on stdin: the code to import, the
pipeline, its validated inputs) and prints one JSON document: the server plans in such a
fresh process with a time limit, so that nothing the code does reaches the server's process.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from graphene_sdk._pipeline import Pipeline, registered
from graphene_sdk._placeholder import _SDK_DIR, Placeholder, PlaceholderBytes, PlanStopped, assuming
from graphene_sdk._remote import RemoteCall
from graphene_sdk._runtime import Guarantee
from graphene_sdk.testing._results import Record, RunResult, RunStatus
from graphene_sdk.testing._runtime import WorldRuntime
from graphene_sdk.testing._world import World
from graphene_sdk.validation import validate_inputs

MAX_ENTRIES = 2000
# Record and run ids in a plan: eight characters, so that what a resource library derives from
# an id (docker's object names take its first eight) is the whole id, found again and shown as
# ``<docker.network net: id>`` in the answer.
_ID = re.compile(r"\brid\d{5}")
_SOURCE = re.compile(r"<([^<>]+?): [^<>]*>")
_SHOWN_CHARS = 200
_REVISIONS = "graphene_revisions."  # graphene_sdk._delivery.PACKAGE_ROOT, without importing it

Plan = dict[str, Any]


class PlanTooLarge(PlanStopped):
    """More entries than a plan holds: a loop that does not end on a placeholder, say."""


class PlanFailed(Exception):
    """The pipeline raised while it was planned (``error`` is what it raised)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"the pipeline raised {type(error).__name__}: {error}")
        self.error = error


def _shown(value: Any) -> Any:
    """A step's or a call's argument as a plan shows it: JSON as it is, else its repr (short)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
        return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"
    return value


def _qualname(fn: Callable[..., Any]) -> str:
    module = str(getattr(fn, "__module__", "?"))
    if module.startswith(_REVISIONS):  # a revision's package: its module as the tree names it
        module = module.split(".", 2)[-1]
    return f"{module}.{getattr(fn, '__qualname__', repr(fn))}"


class PlanWorld(World):
    """The world of a plan's recording pass: records never converge, runs delete nothing at
    their end (the tree is what the run would hold when its code returns), and every call is
    an entry."""

    def __init__(self, *, roots: Sequence[str] = (), max_entries: int = MAX_ENTRIES) -> None:
        super().__init__()
        self.entries: list[dict[str, Any]] = []
        self.refs: dict[str, str] = {}  # record and run ids -> refs ("docker.container db")
        self.outside: set[str] = set()  # ids of what the run would find, not make (attached)
        self.roots = [os.path.abspath(r) + os.sep for r in roots]
        self.max_entries = max_entries
        self._used: set[str] = set()
        self._next_run_ref = "run"
        self._running: list[RunResult[Any]] = []
        self._assumed: set[tuple[str, str]] = set()

    # --- the world's rules, for a recording pass ----------------------------------------------

    def _new_id(self) -> str:
        return f"rid{next(self._ids):05d}"

    def _start_converging(self, record: Record, phase: Any) -> None:
        record.phase = phase  # it never converges: what a run reads of it is a placeholder

    def _finish(self, run: RunResult[Any], status: RunStatus, keep_for: Any) -> None:
        run.status = status
        run.finished_at = self._now
        self._running.remove(run)

    def _runtime_for(self, run: RunResult[Any], pipeline: Pipeline[Any, Any]) -> WorldRuntime:
        self.refs[run.run_id] = self._next_run_ref
        self._used.add(self._next_run_ref)
        self._running.append(run)
        return PlanRuntime(self, run, pipeline)

    # --- entries ------------------------------------------------------------------------------

    def unique(self, base: str) -> str:
        ref, n = base, 1
        while ref in self._used:
            n += 1
            ref = f"{base} #{n}"
        self._used.add(ref)
        return ref

    def short(self, where: str) -> str:
        """``file:line`` with the code's root left out (a revision's tree, the server's directory)."""
        for root in self.roots:
            if where.startswith(root):
                return where[len(root) :]
        return where

    def entry(self, run: RunResult[Any], op: str, **fields: Any) -> dict[str, Any]:
        if len(self.entries) >= self.max_entries:
            raise PlanTooLarge(
                f"the plan has more than {self.max_entries} entries; it stops here (a loop that would "
                "end on a value read from outside, or a very large run)"
            )
        entry = {"seq": len(self.entries) + 1, "run": self.refs[run.run_id], "op": op, **fields}
        self.entries.append(entry)
        return entry

    def assume(self, placeholder: str, where: str) -> None:
        where = self.short(where)
        if (placeholder, where) in self._assumed or not self._running:
            return
        self._assumed.add((placeholder, where))
        self.entry(self._running[-1], "assume", value=placeholder, assumed="true (present, not empty)", where=where)

    def owner_ref(self, owner: str) -> str:
        kind, _, ident = owner.partition(":")
        if kind == "stand":
            return f"stand {ident}"
        return self.refs.get(ident, owner)

    def outside_record(self, kind: str, name: str, ref: str) -> Record:
        """A record the run would find (an attached agent): ready, in no tree of the plan."""
        record = self._insert(kind=kind, name=name, spec={}, labels={}, owner="stand:outside", declared_by="")
        record.phase = "ready"
        self.outside.add(record.id)
        self.refs[record.id] = self.unique(ref)
        return record

    # --- the answer -----------------------------------------------------------------------------

    def clean(self, value: Any) -> Any:
        """JSON of ``value``: placeholders as their text, ids as ``<ref: id>``."""
        if isinstance(value, str):
            text = str.__str__(value)
            return _ID.sub(lambda m: f"<{self.refs[m.group(0)]}: id>" if m.group(0) in self.refs else m.group(0), text)
        if isinstance(value, BaseModel):
            return self.clean(value.model_dump(mode="json"))
        if isinstance(value, Mapping):
            return {str(self.clean(k)): self.clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.clean(v) for v in value]
        if value is None or isinstance(value, bool | int | float):
            return value
        return self.clean(repr(value))

    def _texts(self, value: Any) -> list[str]:
        if isinstance(value, str):
            return [value]
        if isinstance(value, dict):
            return [t for v in value.values() for t in self._texts(v)]
        if isinstance(value, list):
            return [t for v in value for t in self._texts(v)]
        return []

    def _children(self, owner: str) -> list[dict[str, Any]]:
        held = sorted(
            (r for r in self._records.values() if r.owner == owner and r.id not in self.outside),
            key=lambda r: r.position,
        )
        return [self._node(r) for r in held]

    def _node(self, record: Record) -> dict[str, Any]:
        node: dict[str, Any] = {"ref": self.refs[record.id], "kind": record.kind, "name": record.name}
        if record.protected:
            node["protect"] = True
        if not record.alive:
            node["deleted"] = True  # the run deletes it before it ends
        node["children"] = self._children(f"record:{record.id}")
        return node

    def _run_node(self, run: RunResult[Any]) -> dict[str, Any]:
        children = self._children(f"run:{run.run_id}") + [self._run_node(child) for child in run.children]
        return {"ref": self.refs[run.run_id], "kind": "graphene.run", "name": run.pipeline, "children": children}

    def tree(self, root: RunResult[Any]) -> list[dict[str, Any]]:
        stands = sorted({r.owner for r in self._records.values() if r.owner.startswith("stand:")} - {"stand:outside"})
        nodes = [self._run_node(root)]
        for stand in stands:
            name = stand.removeprefix("stand:")
            nodes.append(
                {"ref": f"stand {name}", "kind": "graphene.stand", "name": name, "children": self._children(stand)}
            )
        return nodes

    def document(self, root: RunResult[Any], stopped: dict[str, Any] | None) -> Plan:
        entries = [self.clean(e) for e in self.entries]
        known = self._used
        for entry in entries:
            uses = sorted(
                {m for t in self._texts(entry) for m in _SOURCE.findall(t) if m in known and m != entry.get("ref")}
            )
            if uses:
                entry["uses"] = uses
        return {
            "pipeline": root.pipeline,
            "complete": stopped is None,
            "stopped": stopped,
            "entries": entries,
            "tree": self.tree(root),
            "output": self.clean(root.output_json) if stopped is None else None,
        }


class PlanRuntime(WorldRuntime):
    """What a run's Context calls in a plan: each call is an entry; nothing is done."""

    _world: PlanWorld

    def _entry(self, op: str, **fields: Any) -> dict[str, Any]:
        return self._world.entry(self._run, op, **fields)

    def _ref(self, record_id: str) -> str:
        return self._world.refs.get(record_id) or f"record {record_id}"

    def _declared(self, record_id: str, **extra: Any) -> None:
        world = self._world
        record = world._records[record_id]
        again = record_id in world.refs
        if not again:
            world.refs[record_id] = world.unique(f"{record.kind} {record.name}")
        fields: dict[str, Any] = {
            "ref": world.refs[record_id],
            "kind": record.kind,
            "name": record.name,
            "owner": world.owner_ref(record.owner),
            "spec": record.spec,
        }
        if record.labels:
            fields["labels"] = record.labels
        if record.protected:
            fields["protect"] = True
        if again:
            fields["again"] = True  # declared before in this run: the same record (a new spec, if it changed)
        self._entry("declare", **fields, **extra)

    # --- records --------------------------------------------------------------------------------

    def declare(
        self,
        kind: str,
        name: str,
        spec: Mapping[str, Any],
        labels: Mapping[str, str],
        parent: str | None,
        children: Sequence[str],
        drift: Mapping[str, Any] | None = None,
        protect: bool = False,
    ) -> str:
        record_id = super().declare(kind, name, spec, labels, parent, children, drift, protect)
        self._declared(record_id, **({"children": [self._ref(c) for c in children]} if children else {}))
        return record_id

    def attach(self, record_id: str) -> tuple[str, str]:
        self._check()
        ref = self._world.unique(f"attached {record_id}")
        self._world.refs.setdefault(record_id, ref)
        self._entry("attach", ref=ref, record=record_id)
        return Placeholder(ref, "kind"), record_id

    def ready(self, record_id: str, label: str) -> tuple[dict[str, Any] | None, Any]:
        self._check()
        ref = self._ref(record_id)
        self._entry("ready", target=ref)
        outputs: Any = Placeholder(ref, "outputs")  # read like a dict: outputs["address"]
        return outputs, None

    def to_stand(self, record_id: str, label: str, keep_for: float | None, replace: bool = False) -> None:
        super().to_stand(record_id, label, keep_for, replace)
        fields: dict[str, Any] = {
            "target": self._ref(record_id),
            "stand": self._world.owner_ref(f"stand:{self._pipeline.name}"),
        }
        if keep_for is not None:
            fields["keep_for"] = keep_for
        if replace:
            fields["replace"] = True
        self._entry("to_stand", **fields)

    def delete(self, record_id: str, label: str) -> None:
        super().delete(record_id, label)
        self._entry("delete", target=self._ref(record_id))

    # --- agents ---------------------------------------------------------------------------------

    def agent(self, name: str, labels: Mapping[str, str], needs: list[dict[str, Any]]) -> str:
        record_id = super().agent(name, labels, needs)
        self._declared(record_id)
        return record_id

    def agent_install(self, record_id: str, form: Literal["env", "script"]) -> str:
        super().agent_install(record_id, form)
        ref = self._ref(record_id)
        self._entry("agent_install", target=ref, form=form)
        return Placeholder(ref, f"install_{form}()")

    def agent_via_ssh(self, name: str, labels: Mapping[str, str], target: Mapping[str, Any]) -> str:
        self._check()
        record_id = self._world._declare(self._run, "agent", name, {}, labels, None, ())
        self._declared(record_id, install={"over": "ssh", **target})  # the key by its secret name
        return record_id

    def attach_agent(self, name_or_id: str, needs: list[dict[str, Any]]) -> dict[str, Any]:
        self._check()
        record = self._world.outside_record("agent", name_or_id, f"attached agent {name_or_id}")
        self._entry("attach_agent", ref=self._ref(record.id), agent=name_or_id, needs=needs)
        return {"record_id": record.id, "name": name_or_id}

    def select_agents(self, labels: Mapping[str, str], needs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self._check()
        record = self._world.outside_record("agent", "selected", "selected agent")
        self._entry(
            "select_agents",
            ref=self._ref(record.id),
            labels=dict(labels),
            needs=needs,
            assumed="one machine, standing for each one a run would find",
        )
        return [{"record_id": record.id, "name": record.name}]

    def publish_capability(
        self, record_id: str, label: str, name: str, version: str, labels: Mapping[str, str]
    ) -> None:
        self._check()
        self._agent(record_id, label)
        self._entry(
            "publish_capability", target=self._ref(record_id), capability=name, version=version, labels=dict(labels)
        )

    def _command(self, op: str, record_id: str, label: str, action: str, **fields: Any) -> str:
        self._check()
        self._agent(record_id, label, action)
        agent = self._ref(record_id)
        ref = self._world.unique(f"{agent} {op}")
        self._entry(op, ref=ref, agent=agent, **fields)
        return ref

    def agent_exec(
        self,
        record_id: str,
        label: str,
        argv: Sequence[str],
        env: Mapping[str, str | Mapping[str, str]],
        cwd: str | None,
        timeout: float | None,
        guarantee: Literal["at_least_once", "at_most_once"],
    ) -> dict[str, Any]:
        fields: dict[str, Any] = {"argv": list(argv)}
        if env:
            fields["env"] = dict(env)  # a secret by its name ({"$secret": name})
        if cwd is not None:
            fields["cwd"] = cwd
        if timeout is not None:
            fields["timeout"] = timeout
        if guarantee != "at_least_once":
            fields["guarantee"] = guarantee
        ref = self._command("exec", record_id, label, "run a command on", **fields, assumed="exit code 0")
        return {
            "exit_code": 0,
            "stdout_tail": Placeholder(ref, "stdout_tail"),
            "stderr_tail": Placeholder(ref, "stderr_tail"),
        }

    def agent_put_file(self, record_id: str, label: str, path: str, data: bytes, mode: int) -> dict[str, Any]:
        sha256 = hashlib.sha256(data).hexdigest()
        size = bytes.__len__(data)
        self._command(
            "put_file", record_id, label, "write a file on", path=path, size=size, sha256=sha256, mode=oct(mode)
        )
        return {"size": size, "sha256": sha256}

    def agent_get_file(self, record_id: str, label: str, path: str, max_bytes: int) -> bytes:
        ref = self._command("get_file", record_id, label, "read a file on", path=path)
        return PlaceholderBytes(Placeholder(ref, "content"))

    def agent_call(
        self, record_id: str, label: str, call: RemoteCall, timeout: float | None, guarantee: Guarantee
    ) -> Any:
        ref = self._command(
            "call",
            record_id,
            label,
            "run a function on",
            function=call.name,
            args=[_shown(a) for a in call.args],
            kwargs={k: _shown(v) for k, v in call.kwargs.items()},
        )
        return Placeholder(ref, "result")

    # --- the run's own calls --------------------------------------------------------------------

    def run_children(
        self, pipeline: Pipeline[Any, Any], inputs: Sequence[dict[str, Any]], concurrency: int
    ) -> list[Any]:
        self._check()
        outputs: list[Any] = []
        for item in inputs:
            ref = self._world.unique(f"child run {pipeline.name}")
            fields: dict[str, Any] = {"ref": ref, "pipeline": pipeline.name, "inputs": item}
            if len(inputs) > 1:
                fields["concurrency"] = concurrency
            self._entry("run", **fields)
            self._world._next_run_ref = ref
            child = self._world._execute(pipeline, dict(item), parent=self._run)
            if child.error is not None:
                raise child.error
            outputs.append(Placeholder(ref, "output"))
        return outputs

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        guarantee: Guarantee,
        timeout: float | None,
        retries: int,
    ) -> Any:
        self._check()
        ref = self._world.unique(f"step {name}")
        fields: dict[str, Any] = {"ref": ref, "name": name, "function": _qualname(fn)}
        if args:
            fields["args"] = [_shown(a) for a in args]
        if kwargs:
            fields["kwargs"] = {k: _shown(v) for k, v in kwargs.items()}
        if guarantee != "at_least_once":
            fields["guarantee"] = guarantee
        if timeout is not None:
            fields["timeout"] = timeout
        if retries:
            fields["retries"] = retries
        self._entry("step", **fields)
        return Placeholder(ref, "result")

    def sleep(self, seconds: float) -> None:
        self._check()
        self._entry("sleep", seconds=seconds)

    def log(self, message: str, level: str) -> None:
        self._check_running()
        self._entry("log", level=level, message=message)

    def publish_artifact(
        self, name: str, data: bytes | Path, content_type: str | None, keep_for: float | None, labels: Mapping[str, str]
    ) -> dict[str, Any]:
        self._check()
        world = self._world
        record_id = world._declare(self._run, "artifact", f"{name}@<run number>", {"name": name}, labels, None, ())
        world._move(world._records[record_id], f"stand:{self._pipeline.name}", expires_at=None)
        ref = world.refs[record_id] = world.unique(f"artifact {name}")
        known = isinstance(data, bytes)
        fields: dict[str, Any] = {"ref": ref, "name": name, "stand": world.owner_ref(f"stand:{self._pipeline.name}")}
        if known:
            fields["size"] = bytes.__len__(data)  # type: ignore[arg-type]
        else:
            fields["path"] = str(data)  # a file on the worker: not read by a plan
        if content_type:
            fields["content_type"] = content_type
        if keep_for is not None:
            fields["keep_for"] = keep_for
        self._entry("publish_artifact", **fields)
        return {
            "id": record_id,
            "name": name,
            "sha256": hashlib.sha256(data).hexdigest() if isinstance(data, bytes) else Placeholder(ref, "sha256"),
            "size": bytes.__len__(data) if isinstance(data, bytes) else 0,
            "content_type": content_type or "application/octet-stream",
        }

    def attach_artifact(self, name_or_id: str, pipeline: str | None) -> dict[str, Any]:
        self._check()
        record = self._world.outside_record("artifact", name_or_id, f"attached artifact {name_or_id}")
        ref = self._ref(record.id)
        fields = {"ref": ref, "artifact": name_or_id, "stand": f"stand {pipeline or self._pipeline.name}"}
        self._entry("attach_artifact", **fields)
        return {
            "id": record.id,
            "name": name_or_id,
            "sha256": Placeholder(ref, "sha256"),
            "size": 0,
            "content_type": "application/octet-stream",
        }

    def read_artifact(self, artifact_id: str) -> bytes:
        return PlaceholderBytes(Placeholder(self._ref(artifact_id), "content"))


# --- planning ---------------------------------------------------------------------------------


def _user_frame(error: BaseException) -> str:
    """``file:line`` of the innermost frame of the traceback outside the SDK."""
    frames = [
        f for f in traceback.extract_tb(error.__traceback__) if not os.path.abspath(f.filename).startswith(_SDK_DIR)
    ]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def plan(
    pipeline: Pipeline[Any, Any],
    inputs: BaseModel | Mapping[str, Any] | None = None,
    *,
    roots: Sequence[str] = (),
    max_entries: int = MAX_ENTRIES,
) -> Plan:
    """The plan of a run of ``pipeline`` with ``inputs`` (validated as a start validates them).

    Raises ``PlanFailed`` if the pipeline raises (not because of a placeholder: that stops
    the plan, and the answer says where). ``roots``: directories left out of ``file:line``.
    """
    world = PlanWorld(roots=roots, max_entries=max_entries)
    if isinstance(inputs, BaseModel):
        document: dict[str, Any] = inputs.model_dump(mode="json")
    else:
        document = validate_inputs(pipeline.inputs, dict(inputs or {})).model_dump(mode="json")
    done = assuming(world.assume)
    try:
        root = world._execute(pipeline, document, parent=None)
    finally:
        done()
    error = root.error
    stopped: dict[str, Any] | None = None
    if isinstance(error, PlanStopped):
        stopped = {"reason": error.message, "where": world.short(error.where), "placeholder": error.placeholder}
    elif error is not None:
        text = f"{type(error).__name__}: {error}"
        known = world._used
        found = [m.group(0) for m in _SOURCE.finditer(text) if m.group(1) in known]
        if not found:
            raise PlanFailed(error) from error
        where = world.short(_user_frame(error))
        stopped = {
            "reason": f"the pipeline raised {text[:2000]}{f' at {where}' if where else ''}: it needed the value of "
            f"{found[0]}, which a run reads from outside and a plan does not know; the plan stops here",
            "where": where,
            "placeholder": found[0],
        }
    if stopped is not None:
        for prefix in world.roots:  # file names as ``where`` gives them
            stopped["reason"] = stopped["reason"].replace(prefix, "")
    return world.document(root, stopped)


# --- the subprocess ---------------------------------------------------------------------------


def _plan_request(request: Mapping[str, Any]) -> Plan:
    name, namespace = str(request["pipeline"]), str(request.get("namespace") or "default")
    try:
        if "tree" in request:
            from graphene_sdk import _delivery

            tree = str(request["tree"])
            pipelines = _delivery.load(Path(tree), str(request["package"]), namespace=namespace)
            roots = [tree]
        else:
            sys.path[:0] = [p for p in request.get("path") or [] if p not in sys.path]
            for module in request.get("modules") or []:
                importlib.import_module(str(module))
            pipelines = registered()
            roots = [os.getcwd()]
    except BaseException as exc:
        raise _ImportFailed(exc) from exc
    definition = pipelines.get(name)
    if definition is None:
        raise LookupError(
            f"the code defines no pipeline {name!r}; it defines: {', '.join(sorted(pipelines)) or 'none'}"
        )
    return plan(
        definition, request.get("inputs") or {}, roots=roots, max_entries=int(request.get("max_entries") or MAX_ENTRIES)
    )


class _ImportFailed(Exception):
    def __init__(self, error: BaseException) -> None:
        super().__init__(f"importing the code failed: {type(error).__name__}: {error}")
        self.error = error


def main(argv: list[str]) -> int:
    """``plan``: read a request from stdin, print ``{"ok": true, "plan": ...}`` or
    ``{"ok": false, "error": ..., "traceback": ...}`` as one JSON document."""
    if argv != ["plan"]:
        print("usage: python -m graphene_sdk._plan plan < REQUEST.json", file=sys.stderr)
        return 2
    request = json.loads(sys.stdin.read())
    # What the code prints must not corrupt the document: its stdout goes to stderr.
    out, sys.stdout = sys.stdout, sys.stderr
    try:
        answer: dict[str, Any] = {"ok": True, "plan": _plan_request(request)}
    except (PlanFailed, _ImportFailed) as exc:
        trace = "".join(traceback.format_exception(exc.error))
        answer = {"ok": False, "error": str(exc), "traceback": trace}
    except BaseException as exc:
        answer = {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(exc)),
        }
    finally:
        sys.stdout = out
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
