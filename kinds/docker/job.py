"""``docker.job``: a throwaway container whose exit code is the outcome.

``create`` runs it to completion: exit code 0 makes the record ready with ``exit_code`` and
``stdout_tail``; another code (or running past ``timeout_s``, measured from the container's
start, after which it is killed) is a permanent error whose message ends with the output's
last lines, so the record becomes ``create_failed``. The whole output goes to the record's
log. The finished container is kept until the record is deleted, so a create retried after
a crash adopts its result instead of running the job again (I4).

A job is an event, not a state: it is never observed for drift (``drift_interval = None``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import requests.exceptions

from kinds import KindError, Marked, PermanentError
from kinds.docker import _workload as workload
from kinds.docker._common import (
    DockerKind,
    deletion_requested,
    list_or_nothing,
    log_tail,
    on_engine,
    parse_ts,
    sync_logs,
    sync_logs_quietly,
    translate_errors,
)

if TYPE_CHECKING:
    from apps.records.models import Record

DEFAULT_TIMEOUT_S = 600.0
# Each wait for the exit is a long poll this long; between two, the record is checked for deletion.
POLL_S = 2.0


class JobKind(DockerKind):
    name = "docker.job"
    description = (
        "A container run to completion (g-<name>-<id8>): ready with exit_code and stdout_tail when it exits 0, "
        "create_failed with the output's tail otherwise or after timeout_s. The full output is in the record's log."
    )
    # A finished job is a fact, not a state to keep: never observed for drift.
    drift_interval = None
    spec_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            **workload.WORKLOAD_PROPERTIES,
            "timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": DEFAULT_TIMEOUT_S},
        },
        "required": ["image"],
        "additionalProperties": False,
    }

    @on_engine("create")
    def create(self, record: Record) -> dict[str, Any]:
        container, adopted = workload.adopt_or_create(record, self.name, replace_on_image_change=False)
        with translate_errors(f"inspect container {container.name}"):
            container.reload()
        if (container.attrs.get("State") or {}).get("Status") in ("created", "paused"):
            workload.ensure_started(container)
        timeout = float(record.spec.get("timeout_s", DEFAULT_TIMEOUT_S))
        state = self._wait(record, container, timeout)
        sync_logs(record, container)
        code = state.get("ExitCode")
        if state.get("timed_out"):
            raise PermanentError(
                f"job {container.name} ran longer than its timeout of {timeout:g}s and was killed; "
                f"last lines:\n{log_tail(record)}"
            )
        if code != 0:
            raise PermanentError(f"job {container.name} exited with code {code}; last lines:\n{log_tail(record)}")
        return {
            "exit_code": code,
            "stdout_tail": log_tail(record, stream="stdout"),
            "container": container.name,
            "id": container.id,
            "started_at": state.get("StartedAt"),
            "finished_at": state.get("FinishedAt"),
            "adopted": adopted,
        }

    def _wait(self, record: Record, container: Any, timeout: float) -> dict[str, Any]:
        """The container's final state, after it exited or was killed at its deadline."""
        while True:
            with translate_errors(f"inspect container {container.name}"):
                container.reload()
            state: dict[str, Any] = dict(container.attrs.get("State") or {})
            if state.get("Status") in ("exited", "dead"):
                return state
            started = parse_ts(str(state.get("StartedAt", "")))
            elapsed = (time.time_ns() - started) / 1e9 if started else 0.0
            if elapsed >= timeout:
                with translate_errors(f"kill container {container.name}"):
                    container.kill()
                    container.wait(timeout=30)
                    container.reload()
                return {**container.attrs.get("State", {}), "timed_out": True}
            if deletion_requested(record):
                raise KindError(f"gave up waiting for job {container.name}: the record is being deleted")
            try:
                # A long poll that returns as soon as the container exits.
                container.wait(timeout=max(min(POLL_S, timeout - elapsed), 0.1))
            except requests.exceptions.RequestException:
                continue  # still running (the poll timed out); check the deadline and deletion

    @on_engine("delete")
    def delete(self, record: Record) -> None:
        for container in workload.find(record):
            sync_logs_quietly(record, container)  # a job deleted while it ran: what it said so far
            workload.remove(container)

    def sweep(self) -> Iterable[Marked]:
        found = list_or_nothing(self.name, lambda: workload.sweep_containers(self.name))
        return [Marked(external_id=cid, record_id=rid) for cid, rid in found if rid]

    def delete_external(self, external_id: str) -> None:
        workload.remove_by_id(external_id)
