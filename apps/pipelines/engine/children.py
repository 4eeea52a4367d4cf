"""The runtime's calls that reach beyond the run's own tree: child runs and artifacts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone
from graphene_sdk import ChildRunFailed, ResourceFailed
from graphene_sdk import Pipeline as Definition

from apps.artifacts import blobs
from apps.artifacts import selectors as artifact_selectors
from apps.artifacts import services as artifacts
from apps.core.errors import GrapheneError as ServiceError
from apps.pipelines import services
from apps.pipelines.choices import ATTACH_ARTIFACT_CALL, TERMINAL, EntryStatus, RunStatus
from apps.pipelines.engine.journal import _Suspend, is_uuid, result_of
from apps.pipelines.engine.state import ExecutionState
from apps.pipelines.models import Run


def _children_outcome(pipeline: Definition[Any, Any], outcome: dict[str, Any]) -> list[Any]:
    failures: dict[str, str] = outcome.get("failures") or {}
    if failures:
        position = {run_id: index for index, run_id in enumerate(outcome["children"])}
        by_input = {position[run_id]: why for run_id, why in failures.items()}
        lines = "; ".join(
            f"inputs[{position[run_id]}] (run {run_id}): {why.splitlines()[-1] if why else ''}"
            for run_id, why in failures.items()
        )
        raise ChildRunFailed(
            f"{len(failures)} of {len(outcome['children'])} {pipeline.name} run(s) did not succeed: {lines}",
            failures=failures,
            by_input=by_input,
        )
    return list(outcome["outputs"])


class ChildCalls(ExecutionState):
    def run_children(
        self, pipeline: Definition[Any, Any], inputs: Sequence[dict[str, Any]], concurrency: int
    ) -> list[Any]:
        call = f"run_all {pipeline.name} x{len(inputs)}"
        entry = self.journal.next(call)
        seq = self.journal.seq
        if entry is None:
            with transaction.atomic():  # the child runs and the journal entry commit together
                run = self.journal.fence()
                children = services.run_start_children(
                    parent=run, pipeline_name=pipeline.name, inputs=list(inputs), concurrency=concurrency, group=seq
                )
                ids = [str(c.pk) for c in children]
                self.journal.write(seq, call, EntryStatus.STARTED, {"children": ids})
        elif entry.status == EntryStatus.COMPLETED:
            return _children_outcome(pipeline, result_of(entry))
        else:
            ids = list(result_of(entry)["children"])
        ended = Run.objects.filter(pk__in=ids, status__in=list(TERMINAL)).values_list(
            "pk", "status", "outputs", "error"
        )
        by_id = {str(pk): (status, outputs, error) for pk, status, outputs, error in ended}
        if len(by_id) < len(ids):
            raise _Suspend(waiting_on=[i for i in ids if i not in by_id])
        outcome = {
            "children": ids,
            "outputs": [by_id[i][1] for i in ids],
            "failures": {i: f"{by_id[i][0]}: {by_id[i][2]}".strip() for i in ids if by_id[i][0] != RunStatus.SUCCEEDED},
        }
        self.journal.write(seq, call, EntryStatus.COMPLETED, outcome)
        return _children_outcome(pipeline, outcome)

    # --- artifacts ----------------------------------------------------------------------------

    def publish_artifact(
        self, name: str, data: bytes | Path, content_type: str | None, keep_for: float | None, labels: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Store the bytes, then declare the record, hand it to the stand and journal the reference.

        The blob is staged (streamed, hashed, size-checked) before the transaction and moved
        into the store inside it, with the record and the journal entry: a replay finds the
        entry and returns its reference without reading ``data`` again. A worker killed after
        the move but before the commit leaves an unreferenced blob for the orphan sweeper; the
        replay stores the same digest again (deduplicated).
        """
        call = f"publish_artifact {name}"
        entry = self.journal.next(call)
        seq = self.journal.seq
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error)
            return result_of(entry)
        refused = f"cannot publish artifact {name!r}"
        try:
            content = artifacts.content_type_validate(content_type, name=name)
            chunks = blobs.chunks_of_bytes(data) if isinstance(data, bytes) else blobs.chunks_of_path(data)
            staged = blobs.stage(chunks)
        except (ServiceError, OSError) as exc:
            with transaction.atomic():
                self.journal.fence()
                error = self.journal.refuse(seq, call, f"{refused}: {getattr(exc, 'detail', exc)}")
            raise error from None

        def do(run: Run) -> dict[str, Any]:  # blob, record and journal entry commit together
            with transaction.atomic():  # a refusal leaves no half-published artifact
                record = artifacts.artifact_publish_for_run(
                    run_root=self.owner(None, run),
                    run_number=run.number,
                    stand=services.stand_get(run.pipeline.name, namespace=run.namespace),
                    name=name,
                    staged=staged,
                    content_type=content,
                    labels=dict(labels),
                    expires_at=timezone.now() + timedelta(seconds=keep_for) if keep_for else None,
                )
            return artifacts.ref_of(record)

        try:
            return self.journal.act(seq, call, do, lambda ref: ref, refused=refused)
        finally:
            blobs.discard(staged)  # a no-op once moved into the store

    def attach_artifact(self, name_or_id: str, pipeline: str | None) -> dict[str, Any]:
        call = f"{ATTACH_ARTIFACT_CALL}{name_or_id}" + (f" of {pipeline}" if pipeline else "")
        entry = self.journal.next(call)
        if entry is not None:
            if entry.status == EntryStatus.FAILED:
                raise ResourceFailed(entry.error)
            return result_of(entry)
        record = artifact_selectors.artifact_attachable(artifact_id=name_or_id) if is_uuid(name_or_id) else None
        where = pipeline or self.run.pipeline.name
        if record is None and not is_uuid(name_or_id):
            record = artifact_selectors.artifact_newest(name=name_or_id, pipeline=where)
        if record is None:
            what = (
                f"artifact {name_or_id}"
                if is_uuid(name_or_id)
                else f"artifact {name_or_id!r} on the stand of {where!r}"
            )
            failure = f"cannot attach {what}: none is live (never published, deleted or expired)"
            raise self.journal.refuse(self.journal.seq, call, failure)
        ref = artifacts.ref_of(record)
        self.journal.write(self.journal.seq, call, EntryStatus.COMPLETED, ref)
        return ref

    def read_artifact(self, artifact_id: str) -> bytes:
        try:
            return artifacts.artifact_read(record_id=artifact_id)
        except ServiceError as exc:
            raise ResourceFailed(f"cannot read artifact {artifact_id}: {exc.detail}", record_id=artifact_id) from None
