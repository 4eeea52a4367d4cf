"""Fixtures of the docker kind tests: the real dockerd, a busybox image made with ``docker import``,
records to hand to the kinds, and counting objects by their labels."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from apps.records import services
from apps.records.models import Record
from tests.harness import docker as harness_docker
from tests.harness.docker import IMAGE, busybox_image, busybox_rootfs_tar, counts, labelled

__all__ = ["IMAGE", "counts", "declare", "labelled"]


@pytest.fixture(scope="session")
def docker_client() -> docker.DockerClient:
    return harness_docker.client()


@pytest.fixture(scope="session")
def rootfs_tar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return busybox_rootfs_tar(tmp_path_factory.mktemp("rootfs"))


@pytest.fixture(scope="session")
def image(docker_client: docker.DockerClient, rootfs_tar: Path) -> str:
    return busybox_image(docker_client, rootfs_tar)


@pytest.fixture(autouse=True)
def _clean_up_labelled_objects(docker_client: docker.DockerClient, django_db_setup: None) -> Iterator[None]:
    """Whatever a test left behind in dockerd (a failed assertion mid-way) is removed after it.

    Tests assert their own counts before this runs, so it hides no leak; it only keeps one
    failure from turning into others. Only this session's scope (its test database, set up by
    ``django_db_setup``) is touched.
    """
    yield
    found = labelled(docker_client)
    removals = [
        *(lambda c=c: docker_client.api.remove_container(c.id, force=True, v=True) for c in found["containers"]),
        *(lambda n=n: n.remove() for n in found["networks"]),
        *(lambda v=v: v.remove(force=True) for v in found["volumes"]),
        *(lambda i=i: docker_client.images.remove(i.id, force=True) for i in found["images"]),
    ]
    for remove in removals:  # containers first: networks, volumes and images may be in use
        with contextlib.suppress(docker.errors.NotFound):
            remove()


@pytest.fixture
def owner(db: None) -> Record:
    """A stand to own the records of one test (a root, like a run)."""
    import uuid

    return services.record_create_root(kind="graphene.stand", name=f"docker-{uuid.uuid4().hex[:8]}")


def declare(owner: Record, kind: str, name: str, **spec: Any) -> Record:
    """A record as a run declares it (committed ``pending``); the tests call its kind directly."""
    return services.record_declare(kind=f"docker.{kind}", name=name, owner=owner, spec=spec)
