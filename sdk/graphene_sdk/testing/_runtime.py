"""The ``Runtime`` a run's ``Context`` calls in the world (see ``graphene_sdk._context``)."""

from __future__ import annotations

import mimetypes
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from graphene_sdk._errors import ChildRunFailed, ResourceFailed, StepFailed, StepTimeout
from graphene_sdk._pipeline import Pipeline
from graphene_sdk._remote import RemoteCall
from graphene_sdk._runtime import Guarantee
from graphene_sdk.testing._records import CONVERGING, to_json
from graphene_sdk.testing._results import LogLine, Record, RunResult

if TYPE_CHECKING:
    from graphene_sdk.testing._world import World

_MAX_BACKOFF_SECONDS = 30.0  # the engine's cap on the pause between step attempts


class TimedOut(BaseException):
    """Unwinds a run past its deadline (not an ``Exception``: pipeline code cannot swallow it)."""


class WorldRuntime:
    """The ``Runtime`` behind a run's ``Context`` in the world (see ``graphene_sdk._context``)."""

    def __init__(self, world: World, run: RunResult[Any], pipeline: Pipeline[Any, Any]) -> None:
        self.run_id = run.run_id
        self._world = world
        self._run = run
        self._pipeline = pipeline
        self.deadline = run.started_at + pipeline.timeout if pipeline.timeout else None

    def _check_running(self) -> None:
        if self._run.status != "running":
            raise RuntimeError(f"run {self.run_id} has ended ({self._run.status}); its Context cannot be used")

    def _check(self) -> None:
        self._check_running()
        if self.deadline is not None and self._world.now >= self.deadline:
            raise TimedOut

    def _wait_until(self, moment: datetime) -> None:
        """What a suspended run lives through: the clock moves; past the deadline the run ends."""
        if self.deadline is not None and moment >= self.deadline:
            self._world._advance_to(self.deadline)
            raise TimedOut
        self._world._advance_to(moment)

    def _record(self, record_id: str, label: str, action: str) -> Record:
        record = self._world._records.get(record_id)
        if record is None:
            raise ResourceFailed(f"cannot {action} {label}: record {record_id} does not exist", record_id=record_id)
        return record

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
        self._check()
        return self._world._declare(self._run, kind, name, spec, labels, parent, children, protect)

    def attach(self, record_id: str) -> tuple[str, str]:
        self._check()
        record = self._record(record_id, "a record", "attach")
        return record.kind, record.name

    def to_stand(self, record_id: str, label: str, keep_for: float | None, replace: bool = False) -> None:
        self._check()
        world = self._world
        record = self._record(record_id, label, "hand over")
        stand = f"stand:{self._pipeline.name}"
        if not record.alive:
            raise ResourceFailed(f"cannot hand {label} to the stand: it is deleted", record_id=record_id)
        if record.deletion_waiting:
            raise ResourceFailed(f"cannot hand {label} to the stand: it is being deleted", record_id=record_id)
        if keep_for is not None and keep_for <= 0:
            raise ValueError("keep_for must be positive")
        expires_at = world.now + timedelta(seconds=keep_for) if keep_for is not None else None
        if record.owner == stand:  # handed over before: this sets its TTL again
            record.expires_at = expires_at
            return
        if world._root(record) != f"run:{self.run_id}":
            raise ResourceFailed(
                f"cannot hand {label} to the stand: it is not owned by this run: {world._chain(record)}",
                record_id=record_id,
            )
        held = world._clash(stand, record.kind, record.name)
        if held is not None and not replace:
            raise ResourceFailed(
                f"cannot hand {label} to the stand: the stand {self._pipeline.name!r} already holds a {label} "
                f"({held.id}); replace it with ctx.to_stand(handle, replace=True), give this one another name, "
                f"or delete that one first",
                record_id=record_id,
            )
        if held is not None:
            world._delete(held, "Replaced")
        world._move(record, stand, expires_at=expires_at)

    def ready(self, record_id: str, label: str) -> tuple[dict[str, Any] | None, ResourceFailed | None]:
        self._check()
        record = self._world._records.get(record_id)
        if record is None:
            return None, ResourceFailed(f"{label}: record {record_id} does not exist", record_id=record_id)
        if record.phase in CONVERGING:
            self._wait_until(record.settles_at)  # the engine suspends the run here
        if record.phase == "ready" and record.kind == "agent" and record.spec.get("needs"):
            unmet = self._world._unmet(record, record.spec["needs"])
            if unmet:  # the real system waits for a publish; nothing else publishes in the world
                message = (
                    f"{label} is connected but its machine does not publish {unmet}: publish them first "
                    "(ctx.publish_capability) or declare the machine with World.add_agent(..., capabilities=...)"
                )
                return None, ResourceFailed(message, record_id=record_id, phase="creating")
        if record.deletion_waiting:
            message = f"{label} is being deleted ({record.deletion_waiting}; it waits on a protected record)"
            return None, ResourceFailed(message, record_id=record_id, phase=record.phase)
        if record.phase == "ready":
            return to_json(record.outputs), None
        why = record.error if record.phase == "create_failed" else record.deletion_reason
        message = f"{label} is {record.phase}: {why}".rstrip(": ")
        return None, ResourceFailed(message, record_id=record_id, phase=record.phase)

    def delete(self, record_id: str, label: str) -> None:
        self._check()
        record = self._world._records.get(record_id)
        if record is not None and record.alive:  # deleting is idempotent
            self._world._delete(record, "DeletedByRun")

    def agent(self, name: str, labels: Mapping[str, str], needs: list[dict[str, Any]]) -> str:
        self._check()
        return self._world._declare(self._run, "agent", name, {"needs": needs} if needs else {}, labels, None, ())

    def agent_install(self, record_id: str, form: Literal["env", "script"]) -> str:
        self._check()
        self._record(record_id, "agent", "install")
        token = "GRAPHENE_AGENT_BOOTSTRAP_TOKEN=testing-kit-token"  # noqa: S105 - a fake, nothing connects
        return f"{token}\n" if form == "env" else f"#!/bin/sh\n# testing kit: no agent is installed\n# {token}\n"

    def agent_via_ssh(self, name: str, labels: Mapping[str, str], target: Mapping[str, Any]) -> str:
        # Nothing is installed in the world (and no secret store is consulted): the agent
        # record is declared, and the call returns once it is ready, as the engine's does.
        self._check()
        self._world.ssh_installs.append((name, dict(target)))
        record_id = self._world._declare(self._run, "agent", name, {}, labels, None, ())
        _, error = self.ready(record_id, f"agent/{name}")
        if error is not None:
            raise error
        return record_id

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
        self._check()
        return self._world._run_command(self._agent(record_id, label, "run a command on"), argv)

    def attach_agent(self, name_or_id: str, needs: list[dict[str, Any]]) -> dict[str, Any]:
        self._check()
        record = self._world._attach(name_or_id, needs)
        return {"record_id": record.id, "name": record.name}

    def select_agents(self, labels: Mapping[str, str], needs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self._check()
        return [{"record_id": r.id, "name": r.name} for r in self._world._select(labels, needs)]

    def publish_capability(
        self, record_id: str, label: str, name: str, version: str, labels: Mapping[str, str]
    ) -> None:
        self._check()
        record = self._agent(record_id, label)
        self._world.capabilities.setdefault(record.id, {})[name] = (version, dict(labels))

    def _agent(self, record_id: str, label: str, action: str = "act on") -> Record:
        """The live record of the agent a run acts on (``action`` words the refusal)."""
        record = self._record(record_id, label, action)
        if not record.alive:
            raise ResourceFailed(f"cannot {action} {label}: it is deleted", record_id=record_id)
        return record

    def agent_put_file(self, record_id: str, label: str, path: str, data: bytes, mode: int) -> dict[str, Any]:
        self._check()
        return self._world._put_file(self._agent(record_id, label), path, data)

    def agent_get_file(self, record_id: str, label: str, path: str, max_bytes: int) -> bytes:
        self._check()
        return self._world._get_file(self._agent(record_id, label), label, path, max_bytes)

    def agent_call(
        self, record_id: str, label: str, call: RemoteCall, timeout: float | None, guarantee: Guarantee
    ) -> Any:
        # ``timeout`` is not simulated (the function runs to its end), nor is ``guarantee``.
        self._check()
        return self._world._run_call(self._agent(record_id, label), label, call)

    def run_children(
        self, pipeline: Pipeline[Any, Any], inputs: Sequence[dict[str, Any]], concurrency: int
    ) -> list[Any]:
        # One after another, which honours any concurrency limit; each child is owned by this
        # run and has ended (its records deleted, unless handed to its stand) when this returns.
        self._check()
        children = [self._world._execute(pipeline, dict(item), parent=self._run) for item in inputs]
        failed = [(i, child) for i, child in enumerate(children) if not child.succeeded]
        self._check()
        if failed:
            raise ChildRunFailed(
                f"{len(failed)} of {len(children)} child run(s) of {pipeline.name} did not succeed: "
                + "; ".join(f"inputs[{i}] (run {c.run_id}): {c.error_text or c.status}" for i, c in failed),
                failures={child.run_id: child.error_text or child.status for _, child in failed},
                by_input={i: child.error_text or child.status for i, child in failed},
            )
        return [child.output_json for child in children]

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
        # ``guarantee`` only matters after a crash, which the world does not simulate.
        self._check()
        attempt = 0
        while True:
            attempt += 1
            error: Exception
            began = time.perf_counter()
            try:
                value = fn(*args, **kwargs)
            except Exception as exc:
                error = exc
            else:
                if timeout is not None and time.perf_counter() - began > timeout:
                    # The engine would have abandoned the step at its timeout; here it ran to
                    # its end first, but the outcome for the run is the same.
                    error = StepTimeout(
                        f"step {name!r} timed out after {timeout:g}s", step=name, error_type="StepTimeout"
                    )
                else:
                    try:
                        return to_json(value)
                    except (TypeError, ValueError) as exc:
                        error = TypeError(f"step {name!r} returned a value that cannot be journaled: {exc}")
            if attempt > retries:
                if isinstance(error, StepTimeout):
                    raise StepTimeout(str(error), step=name, error_type="StepTimeout") from error
                text = f"step {name!r} failed: {type(error).__name__}: {error}"
                raise StepFailed(text, step=name, error_type=type(error).__name__) from error
            pause = min(self._world.retry_base_seconds * 2 ** (attempt - 1), _MAX_BACKOFF_SECONDS)
            self._wait_until(self._world.now + timedelta(seconds=pause))

    def sleep(self, seconds: float) -> None:
        self._check()
        self._wait_until(self._world.now + timedelta(seconds=seconds))

    def log(self, message: str, level: str) -> None:
        self._check_running()  # no deadline check: in the engine a log line is not a journaled call
        self._run.logs.append(LogLine(at=self._world.now, level=level, message=message))

    # Artifacts: as in the engine, a published artifact is handed to the stand at once, its
    # record named ``<name>@run-<n>`` (n: the run's number among its pipeline's runs).
    def publish_artifact(
        self, name: str, data: bytes | Path, content_type: str | None, keep_for: float | None, labels: Mapping[str, str]
    ) -> dict[str, Any]:
        self._check()
        world = self._world
        raw = data if isinstance(data, bytes) else Path(data).read_bytes()
        content_type = content_type or mimetypes.guess_type(name)[0] or "application/octet-stream"
        spec = world._artifact_spec(name, raw, content_type)
        number = [r.run_id for r in world._runs.values() if r.pipeline == self._pipeline.name].index(self.run_id) + 1
        stand, record_name = f"stand:{self._pipeline.name}", f"{name}@run-{number}"
        expires_at = world.now + timedelta(seconds=keep_for) if keep_for else None
        record = world._clash(stand, "artifact", record_name)
        if record is not None:
            if record.spec["sha256"] != spec["sha256"]:
                raise ResourceFailed(
                    f"cannot publish artifact {name!r}: artifact {name!r} of this run already exists with other content"
                )
            if record.expires_at is not None and (expires_at is None or expires_at > record.expires_at):
                record.expires_at = expires_at
        else:
            record = world._records[world._declare(self._run, "artifact", record_name, spec, labels, None, ())]
            world._move(record, stand, expires_at=expires_at)
        world.blobs[spec["sha256"]] = raw
        return {"id": record.id, **record.spec}

    def attach_artifact(self, name_or_id: str, pipeline: str | None) -> dict[str, Any]:
        self._check()
        world = self._world
        stand = f"stand:{pipeline or self._pipeline.name}"
        found = [
            r
            for r in world._live("artifact")
            if r.id == name_or_id or (r.spec.get("name") == name_or_id and world._root(r) == stand)
        ]
        if not found:
            raise ResourceFailed(
                f"cannot attach artifact {name_or_id!r} on the {stand}: "
                "none is live (never published, deleted or expired)"
            )
        record = found[-1]  # the newest (records are kept in creation order)
        return {"id": record.id, **record.spec}

    def read_artifact(self, artifact_id: str) -> bytes:
        record = self._world._records.get(artifact_id)
        if record is None or record.kind != "artifact" or not record.alive:
            raise ResourceFailed(f"cannot read artifact {artifact_id}: it does not exist or was deleted")
        return self._world._blob(record)
