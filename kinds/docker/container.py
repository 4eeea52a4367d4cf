"""``docker.container``: a long-running container, ready once ``ready_when`` holds.

``create`` adopts the record's container (and starts it if it stopped: re-converging heals a
stopped container) or creates one, then waits until it is ready: running, healthy, or a log
line matched. Waiting past ``ready_timeout_s`` is a retryable error; a container that exits
before it is ready is one too (the retry starts it again), until the record's create
attempts are used up. ``observe`` also copies the container's new log lines into the
record's log and records its CPU time and memory as metric points.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from kinds import Drift, KindError, Marked, Observed, PermanentError
from kinds.docker import _workload as workload
from kinds.docker._common import (
    DockerKind,
    list_or_nothing,
    masked,
    on_engine,
    parse_ts,
    printed_secrets,
    record_stats,
    sync_logs_quietly,
    tail,
    translate_errors,
    wait_until,
)

if TYPE_CHECKING:
    from apps.records.models import Record

DEFAULT_READY_TIMEOUT_S = 120.0


# How long a container must have been seen running before ``ready_when="running"`` holds.
RUNNING_SETTLE_S = 1.0


class ContainerKind(DockerKind):
    name = "docker.container"
    description = (
        "A long-running Docker container (g-<name>-<id8>), ready when it runs, is healthy or logged a "
        "matching line. A stopped or removed container is drift; re-converging starts or re-creates it."
    )
    spec_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            **workload.WORKLOAD_PROPERTIES,
            "ports": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "container": {"type": "integer", "minimum": 1, "maximum": 65535},
                        "protocol": {"enum": ["tcp", "udp"], "default": "tcp"},
                        "host": {
                            "type": ["integer", "null"],
                            "minimum": 1,
                            "maximum": 65535,
                            "description": "null: any free port (see the outputs' ports)",
                        },
                        "host_ip": {"type": "string", "default": "127.0.0.1"},
                    },
                    "required": ["container"],
                    "additionalProperties": False,
                },
            },
            "healthcheck": {
                "type": "object",
                "properties": {
                    "test": {
                        "type": "array",
                        "items": {"type": "string"},
                        "minItems": 2,
                        "prefixItems": [{"enum": ["CMD", "CMD-SHELL"]}],
                    },
                    "interval_s": {"type": "number", "exclusiveMinimum": 0, "default": 5},
                    "timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 5},
                    "retries": {"type": "integer", "minimum": 1, "default": 3},
                    "start_period_s": {"type": "number", "minimum": 0, "default": 0},
                },
                "required": ["test"],
                "additionalProperties": False,
            },
            "ready_when": {
                "oneOf": [
                    {"enum": ["running", "healthy"]},
                    {
                        "type": "object",
                        "properties": {"log": {"type": "string", "minLength": 1}},
                        "required": ["log"],
                        "additionalProperties": False,
                    },
                ],
                "default": "running",
                "description": "'running', 'healthy' (needs a healthcheck) or {'log': <regex a line must match>}",
            },
            "ready_timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": DEFAULT_READY_TIMEOUT_S},
            "restart": {"enum": ["no", "on-failure", "always", "unless-stopped"], "default": "no"},
        },
        "required": ["image"],
        "additionalProperties": False,
        # 'healthy' without a healthcheck would wait forever.
        "if": {"properties": {"ready_when": {"const": "healthy"}}, "required": ["ready_when"]},
        "then": {"required": ["healthcheck"]},
    }

    @on_engine("create")
    def create(self, record: Record) -> dict[str, Any]:
        ready_when = record.spec.get("ready_when", "running")
        pattern = None
        if isinstance(ready_when, dict):
            try:
                pattern = re.compile(ready_when["log"])
            except re.error as exc:
                raise PermanentError(f"ready_when.log is not a regular expression: {exc}") from None
        container, adopted = workload.adopt_or_create(record, self.name, replace_on_image_change=True)
        workload.ensure_started(container)
        timeout = float(record.spec.get("ready_timeout_s", DEFAULT_READY_TIMEOUT_S))
        condition = ready_when if pattern is None else f"ready (a log line matching {pattern.pattern!r})"
        what = f"container {container.name} to be {condition}"

        running_since: list[float] = []

        def ready() -> bool:
            with translate_errors(f"inspect container {container.name}"):
                container.reload()
            state = container.attrs.get("State") or {}
            if state.get("Status") in ("exited", "dead"):
                raise KindError(
                    f"container {container.name} exited with code {state.get('ExitCode')} before it was ready; "
                    f"last lines:\n{masked(tail(container), printed_secrets(record), is_tail=True)}"
                )
            if not state.get("Running") or state.get("Restarting"):
                return False
            if pattern is not None:
                return self._logged(container, pattern, state.get("StartedAt", ""))
            if ready_when == "healthy":
                return (state.get("Health") or {}).get("Status") == "healthy"
            # "running" means it stays up: a command that fails at once is seen running for a
            # moment; ready only once it has been running for RUNNING_SETTLE_S.
            if not running_since:
                running_since.append(time.monotonic())
            return time.monotonic() - running_since[0] >= RUNNING_SETTLE_S

        try:
            wait_until(ready, timeout=timeout, record=record, what=what)
        finally:
            sync_logs_quietly(record, container)  # what it said while starting, ready or not
        return workload.container_outputs(container, adopted=adopted)

    def _logged(self, container: Any, pattern: re.Pattern[str], started_at: str) -> bool:
        """Whether a line since the container's (latest) start matches ``pattern``."""
        started = parse_ts(started_at)
        since = max(started // 1_000_000_000, 1) if started else None
        with translate_errors(f"read the logs of container {container.name}"):
            raw: bytes = container.logs(stdout=True, stderr=True, since=since)
        return any(pattern.search(line) for line in raw.decode("utf-8", errors="replace").splitlines())

    @on_engine("observe")
    def observe(self, record: Record) -> Observed | None:
        found = workload.find(record)
        if not found:
            return None
        container = found[0]
        outputs = workload.container_outputs(container)
        # What the spec's image reference names now: a moved tag is drift (diff), healed by a new container.
        outputs["spec_image_id"] = workload.image_id(record.spec["image"])
        sync_logs_quietly(record, container)
        if outputs["running"]:
            record_stats(record, container)
        return Observed(outputs)

    def diff(self, record: Record, observed: Observed) -> list[Drift]:
        actual = observed.outputs
        drifts = []
        if not actual.get("running"):
            drifts.append(Drift("running", True, False))
        want_image = actual.get("spec_image_id")
        if want_image and actual.get("image_id") != want_image:
            drifts.append(Drift("image", f"{record.spec['image']} ({want_image})", actual.get("image_id")))
        if record.spec.get("ready_when") == "healthy" and actual.get("health") == "unhealthy":
            drifts.append(Drift("health", "healthy", "unhealthy"))
        return drifts

    @on_engine("delete")
    def delete(self, record: Record) -> None:
        for container in workload.find(record):
            sync_logs_quietly(record, container)  # its last words, before they are gone
            workload.remove(container)

    def sweep(self) -> Iterable[Marked]:
        found = list_or_nothing(self.name, lambda: workload.sweep_containers(self.name))
        return [Marked(external_id=cid, record_id=rid) for cid, rid in found if rid]

    def delete_external(self, external_id: str) -> None:
        workload.remove_by_id(external_id)
