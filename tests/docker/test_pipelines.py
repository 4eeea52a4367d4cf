"""Docker resources in real runs: real worker processes, the real dockerd, objects counted by label."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import docker
import pytest

from apps.pipelines import services
from apps.pipelines.choices import RunStatus
from apps.pipelines.models import Run
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Event, Record
from tests.conftest import Worker, wait_for
from tests.docker import pipelines  # noqa: F401 - registers docker.web and docker.hang in this process
from tests.harness.docker import counts, labelled

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

NOTHING = {"containers": 0, "networks": 0, "volumes": 0, "images": 0}


def finished(run: Run, timeout: float = 180) -> Run:
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status in {"succeeded", "failed", "cancelled", "timed_out"},
        timeout=timeout,
        what=f"{run} to end",
    )
    return Run.objects.get(pk=run.pk)


def run_records(run: Run) -> list[Record]:
    return list(Record.objects.filter(created_by_run_id=run.record_id))


def reaches(record: Record, phase: str, timeout: float = 60) -> None:
    """Wait for the record's phase; on timeout, say where it is and why (its events)."""
    try:
        wait_for(lambda: Record.objects.get(pk=record.pk).phase == phase, timeout=timeout, what=f"{record} {phase}")
    except AssertionError:
        now = Record.objects.get(pk=record.pk)
        events = list(now.events.order_by("id").values_list("type", "reason", "message"))
        raise AssertionError(f"{record} is {now.phase}, not {phase}: {now.last_error!r}; events {events}") from None


def all_deleted(run: Run) -> bool:
    return all(r.phase == Phase.DELETED for r in run_records(run))


def test_a_pipeline_builds_an_environment_with_the_docker_library_and_cleans_it_up(
    workers: list[Worker], rootfs_tar: Path, docker_client: docker.DockerClient
) -> None:
    run = services.run_start(pipeline_name="docker.web", inputs={"rootfs_tar": str(rootfs_tar)})
    run = finished(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.outputs is not None
    assert run.outputs["body"] == "hello-from-web"
    assert run.outputs["exit_code"] == 0
    assert run.outputs["web_address"]
    declared = {r.kind: r for r in run_records(run)}
    assert set(declared) == {"docker.image", "docker.network", "docker.container", "docker.job"}
    assert declared["docker.container"].parent_id == declared["docker.network"].pk
    # The run is over: everything it owned is deleted, in dockerd too.
    wait_for(lambda: all_deleted(run), timeout=120, what="the run's records to be deleted")
    assert counts(docker_client, list(declared.values())) == NOTHING


def test_cancelling_a_run_waiting_for_a_container_leaves_nothing_behind(
    workers: list[Worker], image: str, docker_client: docker.DockerClient
) -> None:
    run = services.run_start(pipeline_name="docker.hang", inputs={"image": image})

    def waiting_on_a_made_container() -> bool:
        made = counts(docker_client, run_records(run))
        return made["containers"] == 1 and Run.objects.get(pk=run.pk).status == RunStatus.SUSPENDED

    wait_for(waiting_on_a_made_container, timeout=120, what="the run to wait on its container")
    assert counts(docker_client, run_records(run)) == {"containers": 1, "networks": 1, "volumes": 1, "images": 0}
    stuck = Record.objects.get(created_by_run_id=run.record_id, kind="docker.container")
    assert stuck.phase == Phase.CREATING  # its create is still waiting for the log line

    services.run_cancel(run=run)
    assert finished(run).status == RunStatus.CANCELLED
    wait_for(lambda: all_deleted(run), timeout=120, what="everything the run owned to be deleted")
    assert counts(docker_client, run_records(run)) == NOTHING


def test_a_worker_killed_while_creating_leaves_one_container_which_is_adopted(
    start_worker: Callable[..., Worker], image: str, docker_client: docker.DockerClient
) -> None:
    doomed = start_worker("doomed", concurrency=1)
    owner = records.record_create_root(kind="graphene.stand", name="docker-crash")
    record = records.record_declare(
        kind="docker.container",
        name="db",
        owner=owner,
        spec={
            "image": image,
            "command": ["sh", "-c", "while true; do sleep 1; done"],
            "healthcheck": {"test": ["CMD-SHELL", "test -f /tmp/go"], "interval_s": 0.2, "retries": 1},
            "ready_when": "healthy",
        },
    )
    (made,) = wait_for(lambda: labelled(docker_client, record)["containers"], timeout=60, what="the container")
    assert Record.objects.get(pk=record.pk).phase == Phase.CREATING
    doomed.kill()  # mid-create: the container exists, the record does not know it yet

    start_worker("survivor")
    # The survivor finds the doomed worker lost (its database session ended) and takes the
    # create over at once (apps/core/workers.py), without waiting for its lease.
    wait_for(
        lambda: Event.objects.filter(record=record, reason="Resumed").exists(),
        timeout=30,
        what="the survivor to resume the create",
    )
    # Killed between creating and starting it, the doomed worker left it "created": the
    # survivor's adoption starts it (the same container), and only then can it be told to go.
    wait_for(
        lambda: docker_client.containers.get(made.id).status == "running",
        timeout=60,
        what="the container adopted and running",
    )
    docker_client.containers.get(made.id).exec_run(["touch", "/tmp/go"])
    reaches(record, Phase.READY)

    record.refresh_from_db()
    assert record.outputs["id"] == made.id
    assert record.outputs["adopted"] is True
    assert counts(docker_client, record)["containers"] == 1

    records.record_delete_request(record=owner)
    reaches(record, Phase.DELETED)
    assert counts(docker_client, record) == NOTHING
