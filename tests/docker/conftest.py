"""Fixtures of the docker kind tests: the real dockerd, a busybox image made with ``docker import``,
records to hand to the kinds, and counting objects by their labels."""

from __future__ import annotations

import contextlib
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from apps.records import services
from apps.records.models import Record
from kinds.docker._common import LABEL_RECORD, LABEL_SCOPE, scope

# The test image: a root file system of busybox-static (its applets as symlinks), imported.
IMAGE = "graphene-test/busybox:kinds"
BUSYBOX = Path("/bin/busybox")


def _rootfs_tar(folder: Path) -> Path:
    """A tar of /bin/busybox with a symlink per applet, plus the directories programs expect."""
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    path = folder / "busybox-rootfs.tar"
    with tarfile.open(path, "w") as tar:
        for name in ("bin", "tmp", "etc", "root", "www", "data"):
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        tar.add(BUSYBOX, arcname="bin/busybox")
        for applet in applets:
            if applet == "busybox":
                continue
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
    return path


@pytest.fixture(scope="session")
def docker_client() -> docker.DockerClient:
    client = docker.from_env(timeout=120)
    client.ping()  # no dockerd, no docker tests: .ci/run starts one (ensure_dockerd)
    return client


@pytest.fixture(scope="session")
def rootfs_tar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _rootfs_tar(tmp_path_factory.mktemp("rootfs"))


@pytest.fixture(scope="session")
def image(docker_client: docker.DockerClient, rootfs_tar: Path) -> str:
    """The busybox image, imported once per machine (another session may have made it)."""
    try:
        docker_client.images.get(IMAGE)
    except docker.errors.NotFound:
        repository, tag = IMAGE.split(":")
        docker_client.api.import_image_from_file(
            str(rootfs_tar), repository=repository, tag=tag, changes=['CMD ["/bin/sh"]']
        )
        docker_client.images.get(IMAGE)
    return IMAGE


def labelled(client: docker.DockerClient, record_ids: Any = None) -> dict[str, list[Any]]:
    """This session's containers, networks, volumes and images (of ``record_ids`` if given)."""
    filters = {"label": [f"{LABEL_SCOPE}={scope()}"]}
    found = {
        "containers": client.containers.list(all=True, filters=filters, sparse=True),
        "networks": client.networks.list(filters=filters),
        "volumes": client.volumes.list(filters=filters),
        "images": client.images.list(all=True, filters=filters),
    }
    if record_ids is None:
        return found
    many = [record_ids] if isinstance(record_ids, str | Record) else list(record_ids)
    wanted = {str(i.pk) if isinstance(i, Record) else str(i) for i in many}

    def of(obj: Any) -> str:
        labels = obj.attrs.get("Labels") or (obj.attrs.get("Config") or {}).get("Labels") or {}
        return str(labels.get(LABEL_RECORD))

    return {key: [obj for obj in objs if of(obj) in wanted] for key, objs in found.items()}


def counts(client: docker.DockerClient, record_ids: Any = None) -> dict[str, int]:
    return {key: len(objs) for key, objs in labelled(client, record_ids).items()}


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
