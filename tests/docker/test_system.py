"""Drift of Docker objects end to end: real dockerd, a real worker process and ``celery beat``."""

from __future__ import annotations

import time
from pathlib import Path

import docker
import pytest

from apps.records import services
from apps.records.choices import Phase
from apps.records.models import Event, Record
from tests.conftest import Worker, running_beat, wait_for
from tests.harness.docker import counts, labelled

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

SERVE = ["sh", "-c", "while true; do sleep 1; done"]
INTERVAL = 3.0


def test_a_container_removed_behind_our_back_is_recreated_within_one_interval(
    workers: list[Worker], owner: Record, image: str, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    record = services.record_declare(
        kind="docker.container",
        name="app",
        owner=owner,
        spec={"image": image, "command": SERVE},
        observe_every=INTERVAL,
    )
    ready = wait_for(
        lambda: Record.objects.filter(pk=record.pk, phase=Phase.READY).first(), timeout=60, what="the container"
    )
    assert ready is not None
    first = ready.outputs["id"]
    with running_beat(tmp_path):
        # The first look after a change comes sooner; wait for a look that found it as specified.
        wait_for(
            lambda: Record.objects.filter(pk=record.pk, observed_at__gt=ready.updated_at).exists(),
            timeout=30,
            what="a first observation through beat",
        )
        docker_client.api.remove_container(first, force=True)  # docker rm -f
        removed_at = time.monotonic()
        healed = wait_for(
            lambda: Record.objects.filter(pk=record.pk, heals=1, phase=Phase.READY).first(),
            timeout=30,
            what=f"the heal of {record} by a worker",
        )
        took = time.monotonic() - removed_at
    assert healed is not None
    # Observed every INTERVAL seconds; beat ticks every 2 s and the create takes about 1 s (the
    # container must stay up for 1 s to count as running): within one interval plus those.
    assert took < INTERVAL + 2 + 3, f"re-created {took:.1f}s after the removal"
    assert healed.outputs["id"] != first
    assert docker_client.containers.get(healed.outputs["id"]).status == "running"
    assert counts(docker_client, record)["containers"] == 1
    gone = Event.objects.get(record=record, type="drift_detected")
    assert gone.reason == "Gone"
    assert gone.data["gone"] is True
    assert list(
        Event.objects.filter(record=record, type="phase_changed", reason="Healed").values_list("reason", flat=True)
    ) == ["Healed"]

    services.record_delete_request(record=owner)
    wait_for(lambda: Record.objects.get(pk=record.pk).phase == Phase.DELETED, timeout=60, what="the deletion")
    assert labelled(docker_client, record)["containers"] == []
