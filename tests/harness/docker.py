"""The real dockerd in tests: the busybox image made with ``docker import``, and this session's
labelled objects (what the kinds made, counted by their labels)."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path
from typing import Any

import docker
import docker.errors

from apps.records.models import Record
from kinds.docker._common import LABEL_RECORD, LABEL_SCOPE, scope

# The test image: a root file system of busybox-static (its applets as symlinks), imported.
IMAGE = "graphene-test/busybox:kinds"
BUSYBOX = Path("/bin/busybox")


def client() -> docker.DockerClient:
    """A client of the machine's dockerd; no dockerd, no docker tests (.ci/run: ensure_dockerd)."""
    found = docker.from_env(timeout=120)
    found.ping()
    return found


def busybox_rootfs_tar(folder: Path) -> Path:
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


def busybox_image(docker_client: docker.DockerClient, rootfs_tar: Path) -> str:
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
