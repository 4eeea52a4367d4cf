"""``Execution``: one attempt at executing a run, holding its lease — the ``Runtime`` that the
SDK's ``Context`` calls. It is made of its parts (records, child runs and artifacts, agents,
steps and timers); this module only puts them together."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from graphene_sdk import Pipeline as Definition

from apps.observability.tracing import RunTelemetry
from apps.pipelines.engine.agents import AgentCalls
from apps.pipelines.engine.children import ChildCalls
from apps.pipelines.engine.journal import Journal
from apps.pipelines.engine.records import RecordCalls
from apps.pipelines.engine.steps import StepCalls
from apps.pipelines.models import Run


class Execution(RecordCalls, ChildCalls, AgentCalls, StepCalls):
    """One attempt at executing a run, holding its lease (the ``Runtime`` of its Context)."""

    def __init__(self, run: Run, token: uuid.UUID, definition: Definition[Any, Any]) -> None:
        self.run = run
        self.run_id = str(run.pk)
        self.token = token
        self.definition = definition
        self.journal = Journal(run, token)
        self.attached_agents = set()
        self._pool: ThreadPoolExecutor | None = None
        self._running = None
        self.telemetry = RunTelemetry(run)  # spans and step metrics, buffered, written in batches

    def close(self) -> None:
        self._steps_done()
